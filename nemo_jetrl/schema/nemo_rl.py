"""NeMo-RL's config tree as an input: its keys are honoured with NeMo-RL's meaning (mapped onto ours), accepted
without effect, or refused by value with one line naming key, value and what to use instead (the key table,
config/nemo_rl_keys.py). A Megatron config is mapped onto our trainer first (nemo_rl_megatron.py, here). A key
NeMo-RL defines (at the pinned commit, config/nemo_rl_facts.py) that the table does not name, or any key under a
NeMo-RL-only subtree, is ignored with one warning line; an unknown key in one of our sections stays an error (the
schema suggests the near key).

Values NeMo-RL spells differently (the model dtype in `policy.precision`, optimizer classes, rollout backends) are
respelled by config/nemo_rl_values.py. This module reads the composed schema (which keys are ours), so it sits
above the sections with it; the key table, the facts and the respellings are data and stay in config/.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel

from nemo_jetrl.config.errors import ConfigError
from nemo_jetrl.config.nemo_rl_facts import is_nemo_rl_mapping, nemo_rl_defines, nemo_rl_only_subtrees
from nemo_jetrl.config.nemo_rl_keys import KEY_RULES
from nemo_jetrl.config.nemo_rl_rules import IGNORED, NULL_SECTION, Rule, Translation, apply_rules, get_path, set_path
from nemo_jetrl.config.nemo_rl_values import respell_values
from nemo_jetrl.schema.master import MasterConfig
from nemo_jetrl.schema.nemo_rl_megatron import map_megatron


def rule_for(key: str) -> Rule | None:
    """The first line of KEY_RULES whose pattern matches `key` (exact keys first). Patterns apply to the keys NeMo-RL
    defines (see `lookup`)."""
    if key in KEY_RULES:
        return KEY_RULES[key]
    return next(
        (rule for pattern, rule in KEY_RULES.items() if "*" in pattern and fnmatch.fnmatchcase(key, pattern)), None
    )


@functools.cache
def is_schema_field(key: str) -> bool:
    """Whether `key` names a field of the master schema (or lies inside a field that is not a section)."""
    model = _schema_node(key)
    return model is not None


@functools.cache
def is_schema_section(key: str) -> bool:
    """Whether `key` names one of our sections (a config type; "" is the whole config)."""
    model = _schema_node(key)
    return isinstance(model, type) and issubclass(model, BaseModel)


def _schema_node(key: str) -> Any:
    """The type at `key` in the master schema ("leaf" inside a non-section field), None where there is none."""
    model: Any = MasterConfig
    for part in key.split(".") if key else ():
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return "leaf"
        if part not in model.model_fields:
            return None
        model = _section_type(model.model_fields[part].annotation)
    return model


@functools.cache
def nemo_rl_only() -> tuple[str, ...]:
    """NeMo-RL's sections that our schema does not have, directly below ours (docs/nemo_rl.md lists them); a
    top-level section newer than the list counts as one too."""
    return tuple(nemo_rl_only_subtrees(is_schema_section, is_schema_field))


def lookup(key: str, value: Any) -> Rule | None:
    """The rule for one leaf `key: value`: None (copy it: our field, or an unknown key the schema rejects), its
    table line, NULL_SECTION (a NeMo-RL section written null) or IGNORED (NeMo-RL's, unknown to the table)."""
    if is_schema_field(key):
        return None
    if key in KEY_RULES:
        return KEY_RULES[key]
    parent = key.rpartition(".")[0]
    pattern = rule_for(key)
    if nemo_rl_defines(key, through_open=not is_schema_section(parent)):
        if pattern is not None:
            return pattern
        if (value is None or value == {}) and is_nemo_rl_mapping(key):
            return NULL_SECTION
        return IGNORED
    in_theirs = any(key.startswith(prefix + ".") for prefix in nemo_rl_only())
    new_section = "." in key and not is_schema_field(key.partition(".")[0])  # a top-level section newer than the list
    if (in_theirs or new_section) and not _near_our_key(key):
        return IGNORED
    return None


def _near_our_key(key: str) -> bool:
    """Whether the first part of `key` that is not ours is close to one of our fields there (a typo)."""
    parts = key.split(".")
    for depth in range(len(parts)):
        section = ".".join(parts[:depth])
        if not is_schema_section(section) or is_schema_field(".".join(parts[: depth + 1])):
            continue
        model = _schema_node(section)
        return bool(difflib.get_close_matches(parts[depth], list(model.model_fields), n=1, cutoff=0.8))
    return False


def _section_type(annotation: Any) -> Any:
    sections = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
    return sections[0] if sections else annotation


def translate_nemo_rl(data: Mapping[str, Any]) -> Translation:
    """The config tree in our spelling (`.tree`) with its start-up lines (`.notes`) and ignored keys (`.warnings`);
    ConfigError (one line, every refused key) if NeMo-RL keys ask for something this implementation does not do."""
    tree, notes, errors = map_megatron({k: v for k, v in data.items()})
    dtype = respell_values(tree, notes, errors)
    result = apply_rules(tree, lookup)
    result.notes[:0] = notes
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
    return result
