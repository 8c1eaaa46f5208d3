"""The builtin `tiny-arith` model: a 3.2M-parameter HF `Qwen3ForCausalLM` sized for a 2-core CPU RL demo.

hidden 256, intermediate 768, 4 layers, 2 query heads x head_dim 128, 1 KV head, tied embeddings, vocab 32 (the
`tokenizer.py` vocabulary). Every linear dimension (256, 768, 2*128, 1*128) is a multiple of 128, so the FP8 recipe
blocks all of them (128x128 weight blocks, 1x128 activation groups) with no partial block.

Attention implementation: "sdpa" (PyTorch scaled_dot_product_attention). It is exact enough for the FP32 warm start
and for HF `generate`, available on CPU and CUDA, and faster than "eager"; the RL path does not use it anyway, it
runs the model's submodules through `models/decoder.py`'s own attention.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from nemo_jetrl.models.tokenizer import BOS_ID, EOS_ID, MODEL_MAX_LENGTH, PAD_ID, VOCAB_SIZE

TINY_ARITH_NAME = "tiny-arith"
TINY_ARITH_DIR = Path(__file__).resolve().parent / "assets" / TINY_ARITH_NAME  # packaged warm-start checkpoint
ATTN_IMPLEMENTATION = "sdpa"


def tiny_arith_config(**overrides) -> Qwen3Config:
    """Qwen3 config of the tiny model; special ids match `build_arith_tokenizer()`. `overrides` replace fields."""
    fields = dict(
        architectures=["Qwen3ForCausalLM"],
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=MODEL_MAX_LENGTH,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        dtype="float32",
        attn_implementation=ATTN_IMPLEMENTATION,
    )
    return Qwen3Config(**{**fields, **overrides})


def build_tiny_model(seed: int) -> Qwen3ForCausalLM:
    """A freshly initialized FP32 tiny model; the same seed gives bitwise-identical weights."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"build_tiny_model: seed must be an int, got {seed!r}")
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):  # leave the caller's RNG stream untouched
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(tiny_arith_config())
    return model.to(torch.float32)


def random_tiny_qwen3(
    seed: int = 0, *, num_layers: int = 2, initializer_range: float = 0.2, **config
) -> Qwen3ForCausalLM:
    """A random tiny Qwen3 (the tiny-arith shape, `num_layers` deep, `config` overriding fields) in eval mode, for
    tests and smoke benchmarks.

    initializer_range 0.2 (HF default 0.02) so greedy outputs vary instead of repeating one token, which makes
    token-for-token checks meaningful.
    """
    cfg = tiny_arith_config(num_hidden_layers=num_layers, initializer_range=initializer_range, **config)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    return model.to(torch.float32).eval()


def random_tiny_qwen3_moe(
    seed: int = 0,
    *,
    num_layers: int = 2,
    num_experts: int = 8,
    top_k: int = 2,
    moe_intermediate_size: int = 128,
    initializer_range: float = 0.2,
    **config,
) -> Qwen3MoeForCausalLM:
    """A random tiny Qwen3-MoE (the tiny-arith attention and vocabulary; every layer sparse: `num_experts` experts of
    `moe_intermediate_size`, `top_k` per token, renormalized) in eval mode, FP32, its MoE blocks converted
    (`models.moe.convert_moe_blocks`), for tests and smoke benchmarks."""
    from nemo_jetrl.models.moe import convert_moe_blocks

    fields = tiny_arith_config(num_hidden_layers=num_layers, initializer_range=initializer_range).to_dict()
    fields.update(architectures=["Qwen3MoeForCausalLM"], num_experts=num_experts, num_experts_per_tok=top_k,
                  moe_intermediate_size=moe_intermediate_size, norm_topk_prob=True, **config)  # fmt: skip
    for key in ("model_type", "transformers_version"):
        fields.pop(key, None)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**fields))
    convert_moe_blocks(model)
    return model.to(torch.float32).eval()
