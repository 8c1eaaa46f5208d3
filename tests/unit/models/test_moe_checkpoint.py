"""Random-init MoE checkpoints (models/random_checkpoint.py): the Qwen3-30B-A3B shape counts as its model card, and a
tiny-moe build loads through the project's loader as a converted Qwen3-MoE whose every expert FP8 can block."""

import json

import pytest
import torch
from transformers import Qwen3MoeForCausalLM

from nemo_jetrl.models.loading import check_fp8_blockable, is_moe_checkpoint, load_model_and_tokenizer
from nemo_jetrl.models.moe import moe_shape
from nemo_jetrl.models.random_checkpoint import (
    analytic_param_count,
    build_random_checkpoint,
    config_shape,
    qwen3_config,
    resolve_shape,
)


def test_qwen3_30b_a3b_counts_as_the_model_card():
    """30.5B parameters in total, 29.9B without the embeddings, 3.3B activated per token (Qwen/Qwen3-30B-A3B)."""
    shape = resolve_shape("qwen3-30b-a3b")
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(qwen3_config(shape, "bfloat16"))
    count = sum(p.numel() for p in model.parameters())
    assert count == analytic_param_count(shape)
    embeddings = 2 * shape["vocab_size"] * shape["hidden_size"]  # untied lm_head
    per_expert = 3 * shape["hidden_size"] * shape["moe_intermediate_size"]
    inactive = shape["num_hidden_layers"] * (shape["num_experts"] - shape["num_experts_per_tok"]) * per_expert
    assert (round(count / 1e9, 1), round((count - embeddings) / 1e9, 1)) == (30.5, 29.9)
    assert 3.3e9 < count - inactive < 3.4e9
    assert len(model.model.layers) == 48 and model.model.layers[0].mlp.experts.gate_up_proj.shape == (128, 1536, 2048)


def test_tiny_moe_build_loads_as_a_converted_moe(tmp_path):
    info = build_random_checkpoint(tmp_path, "tiny-moe", num_train=4, num_val=2)
    model_dir = tmp_path / "model"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config_shape(config) == resolve_shape("tiny-moe")
    assert is_moe_checkpoint(str(model_dir)) and not is_moe_checkpoint("tiny-arith")
    check_fp8_blockable(model_dir, config, 128)
    model, _ = load_model_and_tokenizer(str(model_dir))
    assert moe_shape(model) == (2, 8, 2) and sum(p.numel() for p in model.parameters()) == info["num_parameters"]
    with pytest.raises(ValueError, match=r"mlp.experts.down_proj' \(256x64\) cannot be blocked"):
        check_fp8_blockable(model_dir, {**config, "moe_intermediate_size": 64}, 128)


def test_memory_estimate_counts_every_expert():
    from nemo_jetrl.policy.memory_estimate import ModelShape

    shape = resolve_shape("qwen3-30b-a3b")
    on_disk = {k: v for k, v in shape.items() if k != "num_experts"} | {"num_local_experts": 128}  # transformers 5
    for config in (shape, on_disk):
        model = ModelShape.from_config(config)
        assert (model.experts, model.experts_per_token, model.ffn_rows) == (128, 8, 8)
        assert model.params() == analytic_param_count(shape)
