"""NeMo-RL's config tree as an input: its keys are honoured with NeMo-RL's meaning (mapped onto ours), accepted
without effect, or refused by value with one line naming key, value and what to use instead (nemo_rl_keys.py).

Value spellings: `policy.precision: bfloat16 | float32` (the model dtype: non-FP8 training in that dtype unless
`policy.megatron_cfg.fp8_cfg.enabled`), `policy.optimizer.name: torch.optim.AdamW` + `kwargs`,
`policy.generation.backend: vllm` (vLLM as the rollout engine where it is installed, `generation/vllm_engine.py`;
elsewhere a run names the extra to install or `backend=native`, see docs/nemo_rl.md).
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel

from nemo_jetrl.config.errors import ConfigError, format_value
from nemo_jetrl.config.nemo_rl_keys import KEY_RULES
from nemo_jetrl.config.nemo_rl_rules import Rule, apply_rules, get_path, set_path

_DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}
_OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam"}


def rule_for(key: str) -> Rule | None:
    """The first line of KEY_RULES whose pattern matches `key` (exact keys first)."""
    if key in KEY_RULES:
        return KEY_RULES[key]
    return next(
        (rule for pattern, rule in KEY_RULES.items() if "*" in pattern and fnmatch.fnmatchcase(key, pattern)), None
    )


@functools.cache
def is_schema_field(key: str) -> bool:
    """Whether `key` names a field of the master schema (or lies inside a field that is not a section)."""
    from nemo_jetrl.config.schema import MasterConfig

    model: Any = MasterConfig
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return True
        if part not in model.model_fields:
            return False
        model = _section_type(model.model_fields[part].annotation)
    return True


def _section_type(annotation: Any) -> Any:
    sections = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
    return sections[0] if sections else annotation


def translate_nemo_rl(data: Mapping[str, Any]) -> dict:
    """The config tree in our spelling; ConfigError (one line, every refused key) if NeMo-RL keys ask for something
    this implementation does not do."""
    tree = {k: v for k, v in data.items()}
    errors: list[str] = []
    dtype = _pop_dtype_precision(tree, errors)
    _respell(tree, "policy.optimizer.name", _OPTIMIZERS, errors)
    result = apply_rules(tree, rule_for, is_schema_field)
    errors += result.errors
    if dtype is not None:
        if get_path(result.tree, "policy.precision", None) is None:
            set_path(result.tree, "policy.precision", "bf16")
        compute = get_path(result.tree, "policy.compute_dtype", None)
        if compute is not None and compute != dtype:
            errors.append(f"policy.precision: '{dtype}' disagrees with policy.compute_dtype: '{compute}'; set one")
        set_path(result.tree, "policy.compute_dtype", dtype)
    if errors:
        raise ConfigError(errors[0] if len(errors) == 1 else f"{len(errors)} config errors: " + "; ".join(errors))
    return result.tree


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
