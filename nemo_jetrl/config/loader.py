"""Load a YAML config the NeMo-RL way: `defaults:` inheritance, Hydra-style overrides, OmegaConf resolvers.

    cfg = load_config("examples/configs/grpo_fp8.yaml", ["policy.precision=bf16", "+logger.tag=x"])

`defaults:` is a path or a list of paths relative to the including file. Files are merged in list order (later
items override earlier ones), then the including file itself overrides them; inheritance is recursive and cycles
are reported with the whole chain. Overrides (see `overrides.py`) apply to the merged tree, and interpolations such
as `${policy.precision}` and `${mul:...}` are resolved last, so an override propagates to every key that refers to it.

A file is refused before OmegaConf builds anything when it is larger than `MAX_YAML_BYTES` or its anchors and
aliases expand to more than `MAX_YAML_NODES` nodes (a "billion laughs": a few hundred bytes that would take minutes
and gigabytes to build); the expanded size is counted on PyYAML's node graph, each shared node once.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from nemo_jetrl.config.errors import ConfigError, format_value, omegaconf_message
from nemo_jetrl.config.overrides import apply_overrides, deep_merge

DEFAULTS_KEY = "defaults"
MAX_YAML_BYTES = 1 << 20  # the largest NeMo-RL config is tens of KB
MAX_YAML_NODES = 100_000  # nodes after expanding aliases; NeMo-RL's configs have a few hundred


def _mul(*values):
    _need_args("mul", values, 2)
    return math.prod(values)


def _add(*values):
    _need_args("add", values, 2)
    return sum(values[1:], start=values[0])


def _div(numerator, denominator):
    return numerator / denominator


def _max(*values):
    _need_args("max", values, 2)
    return max(values)


def _need_args(name: str, values: tuple, count: int) -> None:
    if len(values) < count:
        raise ValueError(f"${{{name}:...}} needs at least {count} arguments, got {len(values)}")


def register_resolvers() -> None:
    """Register the OmegaConf resolvers `mul`, `add`, `max` (2+ arguments) and `div` (true division). Idempotent."""
    for name, resolver in {"mul": _mul, "add": _add, "div": _div, "max": _max}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def read_yaml(path: str | os.PathLike, included_from: str | None = None) -> dict:
    """One YAML file as a plain dict (interpolations kept as strings). Errors name the file and, for syntax, the line."""
    where = f" (listed in defaults of {included_from})" if included_from else ""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
        if len(raw) > MAX_YAML_BYTES:
            raise ConfigError(f"{path} is over {MAX_YAML_BYTES} bytes; config files are limited to that size{where}")
        text = raw.decode("utf-8")
        _check_expansion(path, text, where)
        node = OmegaConf.load(io.StringIO(text))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}{where}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}{where}: {exc.strerror or exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        context = f" ({exc.context}" if exc.context else ""
        if context and exc.context_mark is not None and mark is not None and exc.context_mark.line != mark.line:
            context += f" started at line {exc.context_mark.line + 1}"
        context += ")" if context else ""
        raise ConfigError(f"{path}{position}: YAML syntax error: {exc.problem or exc}{context}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read{where}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}){where}") from None
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"{path}: cannot parse YAML: {exc}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: the top level of a config file must be a mapping of keys, got a list")
    return OmegaConf.to_container(node, resolve=False)


def _check_expansion(path: str | os.PathLike, text: str, where: str) -> None:
    """ConfigError when the YAML's aliases expand to more than MAX_YAML_NODES nodes (or refer to themselves)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)  # the node graph: an alias is the anchored node itself
    sizes: dict[int, int] = {}
    pending: set[int] = set()

    def expanded(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in pending:
            raise ConfigError(f"{path}: an alias refers to the node that contains it{where}")
        pending.add(key)
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        total = 1
        for child in children:
            total += expanded(child)
            if total > MAX_YAML_NODES:
                raise ConfigError(
                    f"{path}: its anchors and aliases expand to more than {MAX_YAML_NODES} nodes (a 'billion laughs'?)"
                    f"; config files are limited to that{where}"
                )
        pending.discard(key)
        sizes[key] = total
        return total

    if root is not None:
        expanded(root)


def load_yaml_with_defaults(path: str | os.PathLike) -> dict:
    """The merged, unresolved config tree of `path` and its (recursive) `defaults:` files, as a plain dict."""
    return _load_recursive(Path(path), str(path), chain=[], included_from=None)


def _load_recursive(path: Path, shown: str, chain: list[tuple[Path, str]], included_from: str | None) -> dict:
    real = path.resolve()
    seen = [p for p, _ in chain]
    if real in seen:
        cycle = [name for _, name in chain[seen.index(real) :]] + [shown]
        raise ConfigError("defaults cycle: " + " -> ".join(cycle))
    data = read_yaml(path, included_from)
    defaults = data.pop(DEFAULTS_KEY, None)
    if defaults is None:
        return deep_merge({}, data)  # drops `_override_` markers
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) and d for d in defaults):
        raise ConfigError(f"{shown}: '{DEFAULTS_KEY}' must be a path or a list of paths, got {format_value(defaults)}")
    merged: dict = {}
    for entry in defaults:
        parent = Path(entry) if os.path.isabs(entry) else path.parent / entry
        parent_data = _load_recursive(parent, os.path.normpath(parent), chain + [(real, shown)], shown)
        merged = deep_merge(merged, parent_data)
    return deep_merge(merged, data)


def resolve_config(data: dict) -> DictConfig:
    """Resolve every interpolation of a plain config tree; errors name the key (`a.b: Interpolation key 'x' ...`)."""
    register_resolvers()
    try:
        cfg = OmegaConf.create(data)
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"missing mandatory value '???' for {', '.join(missing)} (set it with an override)")
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException:
        _raise_with_key(data)
        raise
    return cfg


def _raise_with_key(data: dict) -> None:
    """Re-run resolution as `to_container`, whose exceptions carry the offending key, and raise ConfigError."""
    try:
        OmegaConf.to_container(OmegaConf.create(data), resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        raise ConfigError(f"{exc.full_key}: missing mandatory value '???'") from None
    except OmegaConfBaseException as exc:
        message = omegaconf_message(exc)
        raise ConfigError(f"{exc.full_key}: {message}" if exc.full_key else message) from None


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> DictConfig:
    """Load `path` (+ its `defaults:`), apply Hydra-style `overrides`, resolve interpolations. Raises ConfigError."""
    data = load_yaml_with_defaults(path)
    data = apply_overrides(data, overrides)
    return resolve_config(data)
