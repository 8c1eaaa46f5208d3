"""Hydra-style command-line overrides applied to a plain (unresolved) config dict.

    a.b=c        change an existing key (unknown keys are an error naming the key)
    +new.key=v   add a key that does not exist yet
    ++a.b=v      add or change
    ~a.b         delete (`~a.b=v` deletes only if the current value is v)

Values are parsed by hydra-core's override grammar: `x=[1,2]`, `x={a: 1}`, `x=null`, `x=1e-5`, `x=abc`, `x='1'` (str).
"""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException

from nemo_jetrl.config.errors import ConfigError, format_value

_SYNTAX_HELP = "expected key=value, +key=value, ++key=value or ~key"


OVERRIDE_MARKER = "_override_"


def deep_merge(base: dict, update: dict) -> dict:
    """New dict: `update` merged into `base`; nested dicts merge, anything else (lists included) is replaced.

    A mapping of `update` holding `_override_: true` (NeMo-RL's marker, honoured at any depth) replaces the
    inherited mapping instead of merging into it; the marker itself is dropped."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and OVERRIDE_MARKER in value:
            replace = value[OVERRIDE_MARKER] is True
            value = {k: v for k, v in value.items() if k != OVERRIDE_MARKER}
            if replace:
                merged[key] = deep_merge({}, value)
                continue
        if isinstance(merged.get(key), dict) and isinstance(value, dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_override(text: str) -> Override:
    """Parse one override string with hydra's grammar; refuse sweeps, `@package` and empty keys."""
    if not isinstance(text, str):
        raise ConfigError(f"bad override {format_value(text)}: overrides must be strings")
    if "=" not in text and not text.startswith("~"):
        raise ConfigError(f"bad override '{text}': {_SYNTAX_HELP}")
    try:
        override = _parser().parse_override(text)
    except HydraException as exc:
        raise ConfigError(f"bad override '{text}': {_short_parse_message(str(exc))} ({_SYNTAX_HELP})") from None
    key = override.key_or_group
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"bad override '{text}': missing or malformed key ({_SYNTAX_HELP})")
    if override.package is not None:
        raise ConfigError(f"bad override '{text}': '@package' overrides are not supported")
    if override.is_sweep_override():
        raise ConfigError(f"bad override '{text}': sweeps are not supported (quote a string with commas: {key}='a,b')")
    return override


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Return a copy of `data` with each override applied in order. Raises ConfigError naming override and key."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of strings, got the single string '{overrides}'")
    result = copy.deepcopy(data)
    for text in overrides:
        _apply_one(result, text, parse_override(text))
    return result


def _apply_one(data: dict, text: str, override: Override) -> None:
    key = override.key_or_group
    parts = key.split(".")
    found, current = _lookup(data, parts)
    value = copy.deepcopy(override.value())
    if override.type is OverrideType.DEL:
        if not found:
            raise ConfigError(f"cannot delete unknown key '{key}' (override '{text}'){_suggest(data, key)}")
        if value is not None and value != current:
            raise ConfigError(f"cannot delete '{key}': its value is {format_value(current)}, not {format_value(value)}")
        del _parent(data, parts)[parts[-1]]
        return
    if override.type is OverrideType.CHANGE and not found:
        raise ConfigError(f"unknown key '{key}' in override '{text}'{_suggest(data, key, add_hint='+' + text)}")
    if override.type is OverrideType.ADD and found:
        raise ConfigError(f"cannot add '{key}': the key already exists (use '{text[1:]}' to change it)")
    parent = _parent(data, parts, create=True, text=text)
    if isinstance(current, dict) and isinstance(value, dict):
        value = deep_merge(current, value)
    parent[parts[-1]] = value


def _lookup(data: dict, parts: list[str]) -> tuple[bool, Any]:
    node: Any = data
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _parent(data: dict, parts: list[str], create: bool = False, text: str = "") -> dict:
    node = data
    for depth, part in enumerate(parts[:-1]):
        if part not in node and create:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            prefix = ".".join(parts[: depth + 1])
            hint = f"; set the whole mapping: {_as_mapping(prefix, parts[depth + 1 :], text)}" if node is None else ""
            raise ConfigError(
                f"override '{text}': '{prefix}' is not a mapping (its value is {format_value(node)}){hint}"
            )
    return node


def _as_mapping(prefix: str, keys: list[str], text: str) -> str:
    """The override that sets a null mapping at `prefix` to hold `keys` = the value of `text`, quoted for the shell:
    `'policy.dtensor_cfg.env_vars={PYTORCH_CUDA_ALLOC_CONF:"expandable_segments:True"}'`."""
    value = text.partition("=")[2]
    if not value.startswith(("'", '"', "{", "[")) and any(c in value for c in ':,{}[] '):
        value = f'"{value}"'  # Hydra's grammar reads an unquoted ':' or ',' as structure
    for key in reversed(keys):
        value = f"{{{key}:{value}}}"
    return f"'{prefix}={value}'"


def _dotted_keys(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, dict):
            keys.extend(_dotted_keys(value, dotted + "."))
    return keys


def _suggest(data: dict, key: str, add_hint: str | None = None) -> str:
    """`; did you mean 'policy.optimizer.lr'?` (same leaf name first, then close spellings), else the `+` hint."""
    keys = _dotted_keys(data)
    leaf = key.rsplit(".", 1)[-1]
    matches = [k for k in keys if k.rsplit(".", 1)[-1] == leaf] or difflib.get_close_matches(key, keys, n=1)
    if matches:
        return f"; did you mean '{matches[0]}'?"
    return f"; to add a new key use '{add_hint}'" if add_hint else ""


@functools.cache
def _parser() -> OverridesParser:
    return OverridesParser.create()


def _short_parse_message(message: str) -> str:
    """One line from hydra's multi-line parse error (drops the link to the grammar docs)."""
    kept = [line.strip() for line in message.splitlines() if line.strip() and not line.startswith("See http")]
    return "; ".join(kept) or "syntax error"
