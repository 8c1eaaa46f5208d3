"""`ConfigError`: the one user-facing error of the config system (one line, naming file / key / value)."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


class ConfigError(Exception):
    """A user error in a config file or override. `str(err)` is a single line naming the file, key or value."""

    def __init__(self, message: str):
        super().__init__(" ".join(line.strip() for line in str(message).splitlines() if line.strip()))


def format_value(value: Any, limit: int = 60) -> str:
    """Short YAML-flavoured rendering of a value for error messages (`'fp9'`, `null`, `true`, `[1, 2]`)."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def omegaconf_message(exc: Exception) -> str:
    """The first line of an OmegaConf error; an unset `${oc.env:X}` as `environment variable X is not set`."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    unset = re.search(r"Environment variable '([^']+)' not found", text)
    if unset:
        name = unset.group(1)
        return f"environment variable {name} is not set (${{oc.env:{name}}}); set it or override the key"
    return text


class KeyedValueError(ValueError):
    """Raised by schema validators whose message already names the full dotted keys (printed as is)."""


def keyed_check(check: Callable[[Any], Any], value: Any) -> Any:
    """`value`, after `check(value)` passed; a ValueError of `check` (whose message names the key) is raised again as
    a KeyedValueError, for a schema validator."""
    try:
        check(value)
    except ValueError as exc:
        raise KeyedValueError(str(exc)) from None
    return value


def format_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line for a pydantic ValidationError: `key.path: 'value' is not one of a, b; other.key: ...`."""
    messages = [_format_one(error, model) for error in exc.errors()]
    if len(messages) == 1:
        return messages[0]
    return f"{len(messages)} config errors: " + "; ".join(messages)


def _format_one(error: dict, model: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    key = _dotted(loc) or "<config>"
    kind, value = error["type"], error.get("input")
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, KeyedValueError):
        return str(cause)
    if isinstance(cause, ValueError):
        return f"{key}: {cause}"
    if kind == "literal_error":
        return f"{key}: {format_value(value)} is not one of {', '.join(_allowed_values(model, loc))}"
    if kind == "missing":
        return f"{key}: missing required {'item' if isinstance(loc[-1], int) else 'key'}"
    if kind == "extra_forbidden":
        return f"{key}: unknown key{_key_hint(model, loc)}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key}: expected a mapping of keys, got {format_value(value)}"
    reason = error["msg"][:1].lower() + error["msg"][1:]
    return f"{key}: {format_value(value)} is invalid: {reason}"


def _dotted(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(the non-None part of `X | None` with Annotated metadata stripped, whether None is allowed)."""
    nullable = False
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        nullable = len(members) < len(get_args(annotation))
        annotation = members[0] if len(members) == 1 else annotation
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation, nullable


def _field(model: type[BaseModel], loc: tuple) -> tuple[Any, bool]:
    """Annotation of the field at `loc` below `model` (None if it cannot be followed), and its nullability."""
    annotation, nullable = model, False
    for part in loc:
        annotation, _ = _unwrap_optional(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in annotation.model_fields:
            annotation, nullable = _unwrap_optional(annotation.model_fields[part].annotation)
        else:
            return None, False
    return annotation, nullable


def _allowed_values(model: type[BaseModel], loc: tuple) -> list[str]:
    annotation, nullable = _field(model, loc)
    values = [str(v) for v in get_args(annotation)] if get_origin(annotation) is Literal else []
    return values + (["null"] if nullable else [])


def _key_hint(model: type[BaseModel], loc: tuple) -> str:
    parent, _ = _field(model, loc[:-1])
    if not (isinstance(parent, type) and issubclass(parent, BaseModel)):
        return ""
    known = list(parent.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f"; did you mean '{_dotted(loc[:-1] + (close[0],))}'?"
    return f"; allowed keys: {', '.join(known)}"
