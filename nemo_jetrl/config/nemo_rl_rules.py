"""The kinds of NeMo-RL key (honoured by mapping, accepted without effect, refused by value, accepted only when
equal to another key, or mapped by the Megatron pass) and the pass that applies config/nemo_rl_keys.py to a plain
config tree before the schema validates it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_jetrl.config.errors import format_value

_UNSET = object()


@dataclass(frozen=True)
class Rule:
    """`kind`: honoured (moved to `target`, value through `values`), no_effect (dropped), refused (unless the
    value is one of `allowed`, which is then dropped as the neutral setting), same_as (dropped when equal to the
    value of `target`, whose default is `allowed[0]`; refused otherwise), megatron (mapped by schema/nemo_rl_megatron.py
    when `policy.megatron_cfg.enabled: true`, which consumes the key; otherwise no effect, as in NeMo-RL).
    `refused`: honoured keys' values refused by name, each with its reason. `announce`: a no_effect key whose value
    is not one of `allowed`, or a same_as key that differs, is accepted with one start-up line saying what runs."""

    kind: str
    reason: str = ""
    target: str | None = None
    values: Mapping[Any, Any] | None = None
    allowed: tuple = ()
    instead: str = ""
    read_file: bool = False
    refused: Mapping[Any, str] | None = None
    announce: bool = False
    whole: bool = False  # a mapping value is one value (not split into its keys)

    def refusal(self, key: str, value: Any) -> str | None:
        """The one-line error for `key: value`, or None when the value is accepted."""
        if self.kind == "refused" and not _is_in(value, self.allowed):
            return f"{key}: {format_value(value)} is not supported here ({self.reason}); {self.instead}"
        if self.kind == "honoured" and self.refused and _is_in(value, tuple(self.refused)):
            reason = next(r for v, r in self.refused.items() if _same(v, value))
            return f"{key}: {format_value(value)} is not supported here ({reason})"
        if self.kind == "honoured" and self.values is not None and not _is_in(value, tuple(self.values)):
            allowed = ", ".join(format_value(v) for v in self.values)
            return f"{key}: {format_value(value)} is not supported here (one of {allowed})"
        return None

    def mapped(self, value: Any) -> Any:
        """The value for `target` (`_UNSET` when this value says nothing about it)."""
        if self.values is not None:
            value = next(v for k, v in self.values.items() if _same(k, value))
            return _UNSET if value is None else value
        if self.read_file and value is not None:
            try:
                return Path(value).read_text()
            except OSError as exc:
                raise ValueError(f"cannot read {value}: {exc.strerror or exc}") from None
        return value

    def mismatch(self, key: str, value: Any, tree: Mapping[str, Any]) -> str | None:
        """same_as: the one-line error when `value` differs from `target`'s value in `tree` (None when equal)."""
        current = get_path(tree, self.target, self.allowed[0])
        if _same(value, current):
            return None
        if self.announce:
            return f"{key}: {format_value(value)} -> {format_value(current)} ({self.target}): {self.instead}"
        return (
            f"{key}: {format_value(value)} is not supported here ({self.reason}); it must equal {self.target} "
            f"({format_value(current)}): {self.instead}"
        )

    def note(self, key: str, value: Any) -> str | None:
        """An announced no_effect key's start-up line (None for its quiet values)."""
        if self.kind != "no_effect" or not self.announce or _is_in(value, self.allowed):
            return None
        return f"{key}: {format_value(value)}: {self.reason}"

    @property
    def docs(self) -> str:
        if self.kind == "megatron":
            return f"with `policy.megatron_cfg.enabled: true`: {self.reason}; otherwise no effect (as in NeMo-RL)"
        if self.kind == "same_as" and self.announce:
            return (
                f"equal to `{self.target}` (default `{format_value(self.allowed[0])}`); another value runs with one "
                f"start-up line: {self.instead}"
            )
        if self.kind == "same_as":
            return (
                f"must equal `{self.target}` (default `{format_value(self.allowed[0])}`), other values refused "
                f"({self.reason}): {self.instead}"
            )
        if self.kind == "honoured":
            refused = "".join(f"; `{format_value(v)}` refused ({r})" for v, r in (self.refused or {}).items())
            return f"-> `{self.target}`" + (f" ({self.reason})" if self.reason else "") + refused
        if self.kind == "no_effect" and self.announce:
            quiet = ", ".join(f"`{format_value(v)}`" for v in self.allowed)
            return f"{quiet}: nothing; other values: one start-up line: {self.reason}"
        if self.kind == "no_effect":
            return self.reason
        allowed = ", ".join(f"`{format_value(v)}`" for v in self.allowed)
        return f"{allowed} accepted; other values refused ({self.reason}): {self.instead}"


def alias(
    target: str,
    values: Mapping[Any, Any] | None = None,
    *,
    read_file: bool = False,
    reason: str = "",
    refused: Mapping[Any, str] | None = None,
    whole: bool = False,
) -> Rule:
    return Rule("honoured", reason, target=target, values=values, read_file=read_file, refused=refused, whole=whole)


def no_effect(reason: str) -> Rule:
    return Rule("no_effect", reason)


def announced(quiet: list, reason: str) -> Rule:
    """No effect; a value other than `quiet` is accepted with one start-up line `key: value: reason`."""
    return Rule("no_effect", reason, allowed=tuple(quiet), announce=True)


def megatron(reason: str) -> Rule:
    return Rule("megatron", reason)


def only(allowed: list, reason: str, instead: str, *, whole: bool = False) -> Rule:
    return Rule("refused", reason, allowed=tuple(allowed), instead=instead, whole=whole)


def same_as(target: str, default: Any, reason: str, instead: str, *, announce: bool = False) -> Rule:
    return Rule("same_as", reason, target=target, allowed=(default,), instead=instead, announce=announce)


IGNORED = Rule("ignored", "not known to this version of nemo-jetrl: ignored")
NULL_SECTION = Rule("no_effect", "a NeMo-RL section written null: absent")


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _is_in(value: Any, allowed: tuple) -> bool:
    return any(_same(value, a) for a in allowed)


@dataclass
class Translation:
    """Result of one pass: the tree in our spelling, the honoured targets (key -> source), the errors, the start-up
    lines (`notes`) and the keys ignored with a warning."""

    tree: dict = field(default_factory=dict)
    sources: dict[str, tuple[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def leaves(
    tree: Mapping[str, Any], prefix: str = "", whole: Callable[[str], bool] | None = None
) -> list[tuple[str, Any]]:
    """(dotted key, value) of every non-mapping value, every empty mapping and every mapping `whole(key)` keeps."""
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and not (whole and whole(path)):
            out.extend(leaves(value, path + ".", whole))
        else:
            out.append((path, value))
    return out


def get_path(tree: Mapping[str, Any], path: str, default: Any = _UNSET) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_path(tree: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def apply_rules(data: Mapping[str, Any], lookup: Callable[[str, Any], Rule | None]) -> Translation:
    """Keys `lookup` gives no rule (schema fields, or keys the schema will reject) are copied; IGNORED keys are
    dropped with a warning; the rest go through their rule."""
    result = Translation()
    honoured, same = [], []
    for key, value in leaves(data, whole=lambda path: getattr(lookup(path, None), "whole", False)):
        rule = lookup(key, value)
        if rule is None:
            set_path(result.tree, key, value)
            continue
        if rule is IGNORED:
            result.warnings.append(f"{key}: {rule.reason}")
            continue
        error = rule.refusal(key, value)
        note = rule.note(key, value)
        if error:
            result.errors.append(error)
        elif note:
            result.notes.append(note)
        elif rule.kind == "honoured":
            honoured.append((key, value, rule))
        elif rule.kind == "same_as":
            same.append((key, value, rule))
    for key, value, rule in honoured:
        try:
            mapped = rule.mapped(value)
        except ValueError as exc:
            result.errors.append(f"{key}: {exc}")
            continue
        if mapped is not _UNSET:
            _set_agreeing(result, rule.target, mapped, key, value)
    for key, value, rule in same:  # after the honoured keys: `target` holds its final value
        error = rule.mismatch(key, value, result.tree)
        if error:
            (result.notes if rule.announce else result.errors).append(error)
    return result


def _set_agreeing(result: Translation, target: str, mapped: Any, key: str, value: Any) -> None:
    """Set `target`; a value already there (our own key, or another NeMo-RL key) must agree."""
    current = get_path(result.tree, target)
    if current is not _UNSET and not _equal(current, mapped):
        source, shown = result.sources.get(target, (target, current))
        result.errors.append(
            f"{key}: {format_value(value)} disagrees with {source}: {format_value(shown)}; set one of them"
        )
        return
    set_path(result.tree, target, mapped)
    result.sources.setdefault(target, (key, value))


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return _same(a, b)
