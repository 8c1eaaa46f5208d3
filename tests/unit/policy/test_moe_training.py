"""An MoE policy's training (policy/moe_step.py): HF's load-balancing loss added with its coefficient (null: the model
config's), frozen routers with `policy.freeze_moe_router`, and what cannot be captured refused."""

from pathlib import Path

import pytest
import torch

from benchmarks.common import policy_config
from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.models.tiny import random_tiny_qwen3_moe
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
LOSS = ClippedPGLossFn(validate_config(load_config(CONFIGS / "grpo_tiny.yaml")).loss_fn)


def _policy(**policy) -> NativePolicy:
    cfg = policy_config(master_dtype="float32", compute_dtype="float32", **policy)
    return NativePolicy(cfg, PrecisionRecipe.preset("jetrl"), torch.device("cpu"), model=random_tiny_qwen3_moe(0))


def _batch() -> TrainBatch:
    torch.manual_seed(0)
    ids = torch.randint(1, 32, (4, 8))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    response = torch.zeros_like(ids)
    response[:, 5:] = 1
    zeros = torch.zeros(ids.shape)
    return TrainBatch(ids, mask, response, torch.tensor([1.0, -1.0, 0.5, -0.5]), zeros, prev_logprobs=zeros.clone())


def test_load_balancing_loss_is_added_with_its_coefficient():
    policies = {c: _policy(router_aux_loss_coef=c, max_grad_norm=None) for c in (0.0, 0.25, 0.5)}
    default = _policy()
    assert default.moe.aux_coef == default.model.config.router_aux_loss_coef == 0.001  # Qwen3-MoE's
    batch = _batch()
    batch.advantages.zero_()  # no policy-gradient signal: the routers' gradient is the load-balancing loss's alone
    metrics = {c: p.train(batch, LOSS) for c, p in policies.items()}
    grads = {c: p.model.model.layers[0].mlp.gate.weight.grad for c, p in policies.items()}
    assert "moe/load_balancing_loss" not in metrics[0.0] and not grads[0.0].any()
    assert metrics[0.25]["moe/load_balancing_loss"] == metrics[0.5]["moe/load_balancing_loss"] > 1.0  # the same forward
    assert metrics[0.5]["loss"] == metrics[0.0]["loss"]  # `loss` is the policy loss; the aux term is its own metric
    assert torch.allclose(grads[0.5], 2 * grads[0.25], rtol=1e-5, atol=1e-9) and grads[0.5].abs().max() > 1e-4


def test_frozen_routers_keep_their_weights_while_experts_train():
    policy = _policy(freeze_moe_router=True)
    gate = policy.model.model.layers[0].mlp.gate.weight
    experts = policy.model.model.layers[0].mlp.experts.gate_up_proj.weight
    before = (gate.detach().clone(), experts.detach().clone())
    policy.optimizer.param_groups[0]["lr"] = 1e-3
    policy.train(_batch(), LOSS)
    assert not gate.requires_grad and torch.equal(gate, before[0])
    assert not torch.equal(experts, before[1])


def test_captured_training_micro_batches_are_refused():
    with pytest.raises(ValueError, match="cannot capture an MoE model's micro-batches"):
        _policy(train_cuda_graphs=True)


def test_activation_checkpointing_recomputes_the_moe_layers_bit_for_bit():
    grads = []
    for checkpointing in (False, True):
        policy = _policy(router_aux_loss_coef=0.5, max_grad_norm=None,
                         dtensor_cfg={"tensor_parallel_size": 1, "activation_checkpointing": checkpointing})  # fmt: skip
        metrics = policy.train(_batch(), LOSS)
        grads.append((metrics["moe/load_balancing_loss"], [p.grad.clone() for p in policy.model.parameters()]))
    (aux, plain), (aux_ckpt, recomputed) = grads
    assert aux == aux_ckpt and all(torch.equal(a, b) for a, b in zip(plain, recomputed))
