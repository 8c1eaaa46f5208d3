"""The MoE block (models/moe.py) against HF's Qwen3-MoE: same weights, same outputs and gradients in FP32, the same
state-dict names, the whole model through `decoder_forward`, and HF's load-balancing loss."""

import copy
import json

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.logits import compute_logits
from nemo_jetrl.models.moe import MoeBlock, convert_moe_blocks, is_moe, moe_shape, split_expert_tensors
from nemo_jetrl.models.moe_routing import RouterLogits, observing

HF_SHAPE = dict(
    hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=128, vocab_size=96, num_experts=8, num_experts_per_tok=2, initializer_range=0.2,
)  # fmt: skip


def hf_model(seed: int = 0, **config) -> Qwen3MoeForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(**{**HF_SHAPE, "norm_topk_prob": True, **config}, attn_implementation="sdpa")
    return Qwen3MoeForCausalLM(cfg).float().eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_block_matches_hf_sparse_moe_block_in_fp32(norm_topk_prob):
    hf = hf_model(1, norm_topk_prob=norm_topk_prob)
    reference = copy.deepcopy(hf.model.layers[0].mlp)
    assert convert_moe_blocks(hf) == 2 and is_moe(hf) and moe_shape(hf) == (2, 8, 2)
    block = hf.model.layers[0].mlp
    assert isinstance(block, MoeBlock) and block.gate.weight is not reference.gate.weight  # deep copy above
    h = torch.randn(3, 7, 256, requires_grad=True)
    h_ref = h.detach().clone().requires_grad_(True)
    out, want = block(h), reference(h_ref)  # [3, 7, 256] each
    assert out.shape == want.shape and rel_err(out, want) < 1e-6  # only the combine's summation order differs
    grad = torch.randn_like(out)
    out.backward(grad)
    want.backward(grad)
    assert rel_err(h.grad, h_ref.grad) < 1e-5
    pairs = [
        (block.gate.weight.grad, reference.gate.weight.grad),
        (block.experts.gate_up_proj.weight.grad, reference.experts.gate_up_proj.grad),
        (block.experts.down_proj.weight.grad, reference.experts.down_proj.grad),
    ]
    for ours, theirs in pairs:
        assert rel_err(ours, theirs) < 1e-5


def test_state_dict_keeps_hf_names_and_loads_both_ways():
    hf = hf_model(2)
    names = list(hf.state_dict())
    convert_moe_blocks(hf)
    ours = hf.state_dict()
    assert sorted(ours) == sorted(names)  # mlp.gate.weight, mlp.experts.gate_up_proj, mlp.experts.down_proj
    fresh = hf_model(3)
    fresh.load_state_dict(ours)  # into an unconverted HF model
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in ours.items())
    other = hf_model(4)
    convert_moe_blocks(other)
    other.load_state_dict(fresh.state_dict())  # HF names into a converted model
    assert torch.equal(other.model.layers[1].mlp.experts.down_proj.weight, ours["model.layers.1.mlp.experts.down_proj"])
    assert convert_moe_blocks(other) == 2  # idempotent: nothing left to convert


def test_split_expert_tensors_is_hf_save_pretrained_layout(tmp_path):
    from safetensors.torch import load_file

    hf = hf_model(5)
    hf.save_pretrained(tmp_path)
    on_disk = load_file(tmp_path / "model.safetensors")
    convert_moe_blocks(hf)
    split = split_expert_tensors(hf.state_dict())
    assert set(split) == set(on_disk) and len(split) == 2 * (8 * 3) + 21  # 24 expert tensors per layer
    assert all(torch.equal(split[k], on_disk[k]) for k in on_disk)


def test_decoder_forward_matches_hf_model_logits_and_refuses_unconverted_blocks():
    hf = hf_model(6)
    ids = torch.randint(1, 96, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        with pytest.raises(ValueError, match="convert the HF MoE blocks first"):
            decoder_forward(hf, ids, position_ids_from_mask(mask), mask)
        convert_moe_blocks(hf)
        logits = compute_logits(hf, decoder_forward(hf, ids, position_ids_from_mask(mask), mask))
    real = mask.bool()
    assert rel_err(logits[real], want[real]) < 2e-5


def test_load_balancing_loss_is_hfs_aux_loss():
    hf = hf_model(7)
    ids = torch.randint(1, 96, (3, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, output_router_logits=True).aux_loss
    convert_moe_blocks(hf)
    logits = RouterLogits()
    with torch.no_grad(), observing(hf, logits):
        decoder_forward(hf, ids, position_ids_from_mask(mask), mask)
    assert len(logits.logits) == 2 and logits.logits[0].shape == (18, 8)
    ours = logits.load_balancing_loss(8, 2, mask.flatten())
    assert abs(float(ours) - float(want)) < 1e-5 * float(want) and float(want) > 1.0
    assert all(b.observers == () for b in hf.modules() if isinstance(b, MoeBlock))  # restored after the block


def test_export_writes_hfs_per_expert_layout_and_the_trainers_fp8_bits(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from nemo_jetrl.models.export import export_hf
    from nemo_jetrl.models.tiny import random_tiny_qwen3_moe
    from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8

    model = random_tiny_qwen3_moe(8)
    export_hf(model, None, tmp_path / "bf16", dtype=torch.float32)
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").state_dict()
    ours = model.state_dict()
    assert sorted(back) == sorted(ours) and all(torch.equal(back[k], v) for k, v in ours.items())
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    export_hf(model, None, tmp_path / "fp8", fp8=True)
    tensors = load_file(tmp_path / "fp8" / "model.safetensors")
    cached = model.model.layers[1].mlp.experts.gate_up_proj.quantized_weight()  # [8, 256, 256], scales [8, 2, 2]
    up, up_scale = (
        tensors["model.layers.1.mlp.experts.5.up_proj.weight"],
        tensors["model.layers.1.mlp.experts.5.up_proj.weight_scale_inv"],
    )
    assert up.dtype == torch.float8_e4m3fn and up.shape == (128, 256) and up_scale.shape == (1, 2)
    assert torch.equal(up.view(torch.uint8), cached.data[5, 128:].view(torch.uint8))
    assert torch.equal(up_scale, cached.scale[5, 1:])
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"]["modules_to_not_convert"] == [
        "lm_head",
        "model.layers.0.mlp.gate",
        "model.layers.1.mlp.gate",
    ]
    assert "model.layers.0.mlp.experts.gate_up_proj" not in tensors  # no fused tensor beside the per-expert ones
