"""Random-init Qwen3 checkpoints of real shapes (Qwen3-1.7B, Qwen3-8B, Qwen3-30B-A3B) for speed runs with no download.

`build_random_checkpoint(out_dir, shape)` writes

    out_dir/model/   config.json, generation_config.json, safetensors weights, the byte-level ChatML tokenizer
    out_dir/data/    train.jsonl, val.jsonl (arithmetic word problems: `problem` / `answer`)
    out_dir/build_info.json   shape, seed, dtype, parameter count, paths

Weights follow HF's Qwen3 / Qwen3-MoE init (normal(0, initializer_range)); the same seed on the same device gives the
same bits. A shape with `num_experts` is a Qwen3-MoE (`Qwen3MoeForCausalLM`: every layer sparse, no shared expert).
Speed does not depend on the values, but rewards do: a random model scores 0 on every problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from nemo_jetrl.data.word_problems import write_word_problem_splits
from nemo_jetrl.models.byte_tokenizer import BYTE_VOCAB_SIZE, build_byte_chat_tokenizer

SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "rope_theta",
    "max_position_embeddings",
)
MOE_KEYS = ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob")
# Qwen3-1.7B / Qwen3-8B as published (config.json of Qwen/Qwen3-1.7B, Qwen/Qwen3-8B); tiny-test: a 2-core CPU check
# whose linear dims are multiples of 128 (FP8 blocks) and whose vocab exceeds the tokenizer's, as Qwen's does.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
    ),
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
    ),
    # Qwen/Qwen3-30B-A3B's config.json: 128 experts, 8 active, expert FFN 768 (intermediate_size: unused, no dense
    # layer); tiny-moe (below): its CPU-test sibling, tiny-test's attention with 8 experts, 2 active
    "qwen3-30b-a3b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
    ),
    "tiny-test": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        vocab_size=512,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
    ),
}
SHAPES["tiny-moe"] = dict(
    SHAPES["tiny-test"], moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True
)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_shape(shape: str, num_layers: int | None = None) -> dict[str, Any]:
    """The `SHAPE_KEYS` of preset `shape`, with `num_layers` decoder layers when given."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    fields = dict(SHAPES[shape])
    if num_layers is not None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"--layers must be an int >= 1, got {num_layers!r}")
        fields["num_hidden_layers"] = num_layers
    return fields


def is_moe_shape(shape: dict[str, Any]) -> bool:
    return bool(shape.get("num_experts"))


def analytic_param_count(shape: dict[str, Any]) -> int:
    """Parameters of a Qwen3ForCausalLM / Qwen3MoeForCausalLM of `shape` (no biases; q/k RMSNorm over head_dim; tied
    lm_head counted once)."""
    h, inter, hd = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    attention = h * q + 2 * h * kv + q * h + 2 * hd  # q, k, v, o projections + q_norm, k_norm
    if is_moe_shape(shape):  # E experts' gate/up/down + the router [E, H]
        experts = shape["num_experts"]
        ffn = experts * 3 * h * shape["moe_intermediate_size"] + experts * h
    else:
        ffn = 3 * h * inter  # gate/up/down
    layer = attention + ffn + 2 * h  # + the two RMSNorms
    embeddings = shape["vocab_size"] * h * (1 if shape["tie_word_embeddings"] else 2)
    return embeddings + shape["num_hidden_layers"] * layer + h  # + the final norm


def qwen3_config(shape: dict[str, Any], dtype: str) -> Qwen3Config | Qwen3MoeConfig:
    """Qwen3 (Qwen3-MoE) config of `shape`, with the byte tokenizer's special ids (pad <|endoftext|>, eos
    <|im_end|>)."""
    if shape["vocab_size"] < BYTE_VOCAB_SIZE:
        raise ValueError(f"vocab_size {shape['vocab_size']} is smaller than the tokenizer's {BYTE_VOCAB_SIZE} tokens")
    tokenizer = build_byte_chat_tokenizer()
    config_class, model_class = _classes(shape)
    return config_class(
        architectures=[model_class.__name__],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype=dtype,
        **shape,
    )


def _classes(shape: dict[str, Any]) -> tuple[type, type[PreTrainedModel]]:
    return (Qwen3MoeConfig, Qwen3MoeForCausalLM) if is_moe_shape(shape) else (Qwen3Config, Qwen3ForCausalLM)


def config_shape(config: dict[str, Any]) -> dict[str, Any]:
    """The `SHAPE_KEYS` (+ `MOE_KEYS` of an MoE) of a config.json dict (rope_theta read from `rope_parameters` in
    transformers >= 5)."""
    config = {"num_experts": config.get("num_local_experts"), **config}  # transformers >= 5 writes num_local_experts
    out = {k: config.get(k) for k in SHAPE_KEYS + (MOE_KEYS if config["num_experts"] else ())}
    if out["rope_theta"] is None:
        out["rope_theta"] = (config.get("rope_parameters") or {}).get("rope_theta")
    return out


def _init_model(config: Qwen3Config | Qwen3MoeConfig, dtype: torch.dtype, device: str, seed: int) -> PreTrainedModel:
    """Random-init model built directly in `dtype` on `device` (no FP32 copy of an 8B model in host memory)."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    previous = torch.get_default_dtype()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = (Qwen3MoeForCausalLM if isinstance(config, Qwen3MoeConfig) else Qwen3ForCausalLM)(config)
        finally:
            torch.set_default_dtype(previous)
    return model.to(dtype).eval()


def build_random_checkpoint(
    out_dir: Path,
    shape_name: str,
    *,
    num_layers: int | None = None,
    dtype: str = "bfloat16",
    seed: int = 0,
    device: str = "cpu",
    num_train: int = 256,
    num_val: int = 32,
    stage: Callable[[str], None] = lambda name: None,
) -> dict[str, Any]:
    """Write the model, tokenizer and data under `out_dir` (module docstring); returns the build_info dict.

    `stage(name)` is called before each stage (a progress-bar hook).
    """
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"--seed must be an int, got {seed!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available here")
    shape = resolve_shape(shape_name, num_layers)
    out_dir = Path(out_dir)
    model_dir, data_dir = out_dir / "model", out_dir / "data"
    if model_dir.exists() and any(model_dir.iterdir()):
        raise ValueError(f"{model_dir} exists and is not empty; pick another --out or remove it")
    config = qwen3_config(shape, dtype)

    stage(f"init weights ({shape_name}, {shape['num_hidden_layers']} layers, {dtype}, seed {seed})")
    model = _init_model(config, DTYPES[dtype], device, seed)
    num_params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    if num_params != analytic_param_count(shape):
        raise RuntimeError(f"built {num_params} parameters, the analytic count is {analytic_param_count(shape)}")

    stage("save safetensors")
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir)
    del model

    stage("tokenizer")
    build_byte_chat_tokenizer().save_pretrained(model_dir)

    stage(f"dataset ({num_train} train + {num_val} val rows)")
    train_path, val_path = write_word_problem_splits(data_dir, num_train, num_val, seed)

    info = {
        "shape": shape_name,
        **shape,
        "dtype": dtype,
        "seed": seed,
        "num_parameters": num_params,
        "model_dir": str(model_dir.resolve()),
        "train_jsonl": str(train_path.resolve()),
        "val_jsonl": str(val_path.resolve()),
    }
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
