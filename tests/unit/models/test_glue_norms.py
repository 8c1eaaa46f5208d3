"""The exact mode's per-row norm kernel covers every supported family's RMSNorm, and refuses a norm it does not know.

A missing class (Qwen3-MoE's, until 2026-11-28) ran torch's own mean, which on CUDA rounds by the batch's shape: the
tiny Qwen3-MoE's decode step left the trainer's forward by one token in 192 in the exact mode (H200)."""

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from nemo_jetrl.models import fused_ops, matched_check
from nemo_jetrl.models.batch_invariant import enable_batch_invariant
from nemo_jetrl.models.decoder import decoder_forward, unfused_norms
from nemo_jetrl.models.forward_plan import ForwardPlan
from nemo_jetrl.models.loading import SUPPORTED_MODEL_TYPES
from nemo_jetrl.models.tiny import random_tiny_qwen3

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(SUPPORTED_MODEL_TYPES))
def test_every_supported_familys_norm_is_the_glue_kernels_reference(model_type):
    config = AutoConfig.for_model(model_type, **TINY)
    model = AutoModelForCausalLM.from_config(config)
    norms = [m for m in model.modules() if hasattr(m, "variance_epsilon")]
    assert len(norms) >= 3  # two per layer and the final one (+ Qwen3's q/k norms)
    gen = torch.Generator().manual_seed(0)
    for norm in norms:
        assert fused_ops.fusable_rms_norm(norm), type(norm).__name__
        with torch.no_grad():
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=gen))
            x = torch.randn(3, 5, norm.weight.numel(), generator=gen, dtype=torch.bfloat16)
            assert torch.equal(norm(x), fused_ops.rms_norm_ref(x, norm.weight, norm.variance_epsilon))


class OtherRMSNorm(nn.Module):
    """A norm of a family the glue kernels do not know (same parameters as HF's)."""

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = weight, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_ops.rms_norm_ref(x, self.weight, self.variance_epsilon)


def test_the_exact_mode_refuses_a_norm_without_a_batch_invariant_kernel():
    model = random_tiny_qwen3(0)
    enable_batch_invariant(model)
    ids = torch.ones(1, 4, dtype=torch.long)
    pos, mask = torch.arange(4)[None], torch.ones(1, 4, dtype=torch.long)
    plan = ForwardPlan.trainer(model, None, fused_train=True)  # the trainer's glue kernels (raised before they run)
    eager = ForwardPlan.trainer(model, None, fused_train=False)  # no glue kernels: nothing to refuse
    before = decoder_forward(model, ids, pos, mask, eager)  # [1, 4, H]
    layer = model.model.layers[0]
    layer.post_attention_layernorm = OtherRMSNorm(layer.post_attention_layernorm.weight, 1e-6)
    assert unfused_norms(model) == ["OtherRMSNorm"]
    with pytest.raises(ValueError, match=r"no batch-invariant kernel for \['OtherRMSNorm'\]"):
        decoder_forward(model, ids, pos, mask, plan)
    assert torch.equal(decoder_forward(model, ids, pos, mask, eager), before)  # the same math, by torch


def test_the_matched_kernels_self_check_turns_them_off_for_such_a_norm_on_cuda(monkeypatch):
    """`matched_kernels: auto` says no (one line) instead of a refusal at the first forward; the CPU's glue-free
    path has no such norm problem."""
    model = random_tiny_qwen3(0)
    assert unfused_norms(model) == []
    layer = model.model.layers[0]
    layer.input_layernorm = OtherRMSNorm(layer.input_layernorm.weight, 1e-6)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # as the GPU's parameters are
    problem = matched_check.matched_kernels_problem(model, None)
    assert problem == "no batch-invariant kernel for the norms ['OtherRMSNorm']"
