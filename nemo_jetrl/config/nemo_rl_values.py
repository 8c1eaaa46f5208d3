"""NeMo-RL values spelled differently from ours, respelled before the key table runs (schema/nemo_rl.py).

- `policy.precision: bfloat16 | float32` is NeMo-RL's model dtype: non-FP8 training in that dtype
  (`policy.compute_dtype`) unless `policy.megatron_cfg.fp8_cfg.enabled`; ours (`bf16 | fp8`) names the GEMM format.
- `policy.optimizer.name: torch.optim.AdamW | torch.optim.Adam` (+ `kwargs`); TransformerEngine's FusedAdam is AdamW
  (its default `adam_w_mode`) with an FP32 master copy: torch's AdamW here, with one start-up line.
- `policy.generation.backend`: `vllm` is vLLM (generation/vllm_engine.py); `sglang`, `trtllm`, `megatron` and
  `dynamo` are other engines of the same sampling: the native engine runs them, with one start-up line. vLLM with
  top_p < 1 or top_k reports the truncated distribution's logprobs, which the trainer does not score: the native
  engine samples the same distribution and reports matching ones (one line). vLLM's own KV block size
  (`vllm_kwargs.block_size`) is speed only: the adapter keeps 16 (one line).
- `data.default` holds settings for every dataset: merged into `data.train` and `data.validation` (where that is a
  mapping), their own keys winning, as in NeMo-RL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_jetrl.config.errors import format_value
from nemo_jetrl.config.nemo_rl_rules import get_path

_DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}
FUSED_ADAM = "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam"
_OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam", FUSED_ADAM: "adamw"}
OTHER_ENGINES = ("sglang", "trtllm", "megatron", "dynamo")


def respell_values(tree: dict, notes: list[str], errors: list[str]) -> str | None:
    """Respell `tree` in place (copying what it changes); returns NeMo-RL's model dtype, if it gave one."""
    dtype = _pop_dtype_precision(tree, errors)
    if get_path(tree, "policy.optimizer.name", None) == FUSED_ADAM:
        notes.append(
            "policy.optimizer.name: TransformerEngine's FusedAdam -> torch AdamW (the same decoupled-weight-decay "
            "update on an FP32 master copy)"
        )
    _respell(tree, "policy.optimizer.name", _OPTIMIZERS, errors)
    _generation_backend(tree, notes)
    _merge_data_defaults(tree)
    return dtype


def _merge_data_defaults(tree: dict) -> None:
    data = tree.get("data")
    if not isinstance(data, Mapping) or "default" not in data:
        return
    default = data["default"] if isinstance(data["default"], Mapping) else {}
    merged = {k: v for k, v in data.items() if k != "default"}
    for name in ("train", "validation"):
        if isinstance(merged.get(name), Mapping):
            merged[name] = {**default, **merged[name]}
    if default and not isinstance(merged.get("train"), Mapping | list):
        merged["train"] = dict(default)  # no per-dataset section: the defaults describe the one dataset
    tree["data"] = merged


def _generation_backend(tree: dict, notes: list[str]) -> None:
    gen = get_path(tree, "policy.generation", None)
    if not isinstance(gen, Mapping):
        return
    backend, key = gen.get("backend"), "policy.generation.backend"
    top_p, top_k = gen.get("top_p", 1.0), gen.get("top_k")
    if backend in OTHER_ENGINES:
        notes.append(f"{key}: {format_value(backend)} -> native (nemo-jetrl's rollout engine on the trainer's "
                     "weights: the same sampling, another engine)")  # fmt: skip
    elif backend == "vllm" and ((isinstance(top_p, int | float) and top_p < 1) or top_k is not None):
        notes.append(f"{key}: 'vllm' -> native: with top_p < 1 / top_k vLLM reports the truncated distribution's "
                     "logprobs; the native engine samples the same distribution and reports the ones the trainer "
                     "scores")  # fmt: skip
    else:
        if backend == "vllm" and get_path(gen, "vllm_kwargs.block_size", None) not in (None, 16):
            kwargs = {k: v for k, v in gen["vllm_kwargs"].items() if k != "block_size"}
            _replace(tree, "policy.generation.vllm_kwargs", kwargs)
            notes.append(f"policy.generation.vllm_kwargs.block_size: {gen['vllm_kwargs']['block_size']}: vLLM's KV "
                         "block size (speed only): the adapter keeps 16")  # fmt: skip
        return
    _replace(tree, key, "native")


def _pop_dtype_precision(tree: dict, errors: list[str]) -> str | None:
    """NeMo-RL's `policy.precision` names the model dtype; ours names the GEMM format (bf16 | fp8)."""
    value = get_path(tree, "policy.precision", None)
    if not isinstance(value, str) or value in ("bf16", "fp8"):
        return None
    if value not in _DTYPES:
        errors.append(
            f"policy.precision: {format_value(value)} is not supported here (one of bfloat16, float32, bf16, fp8)"
        )
        return None
    _replace(tree, "policy", {k: v for k, v in tree["policy"].items() if k != "precision"})
    return _DTYPES[value]


def _respell(tree: dict, key: str, spellings: Mapping[str, str], errors: list[str]) -> None:
    value = get_path(tree, key, None)
    if isinstance(value, str) and value in spellings:
        section, _, leaf = key.rpartition(".")
        parent = get_path(tree, section)
        copied = {**parent, leaf: spellings[value]}
        _replace(tree, section, copied)
    elif isinstance(value, str) and "." in value:  # another torch.optim class
        errors.append(f"{key}: {format_value(value)} is not supported here (one of {', '.join(spellings)})")


def _replace(tree: dict, path: str, value: Any) -> None:
    """Set `path` without mutating the caller's nested dicts (copies along the path)."""
    head, _, rest = path.partition(".")
    if not rest:
        tree[head] = value
        return
    tree[head] = dict(tree[head])
    _replace(tree[head], rest, value)
