"""`Section`, the base of every config section type, and the strict value types the sections use.

Each component owns its section type beside its code (algorithms/config.py, policy/config.py, ...); the master
schema (config/schema.py) composes them. Defaults live in these types only: a partial config is valid.

Values are strict: integers reject booleans and floats (`true` is not 1), floats reject booleans, infinities and NaN.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict


def _reject_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def _true_false_or_auto(value: Any) -> Any:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"{value!r}: expected true, false or auto")


StrictInt = Annotated[int, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
FiniteFloat = Annotated[float, BeforeValidator(_reject_bool), Field(allow_inf_nan=False)]
PositiveFloat = Annotated[FiniteFloat, Field(gt=0)]
NonNegativeFloat = Annotated[FiniteFloat, Field(ge=0)]
UnitFloat = Annotated[FiniteFloat, Field(ge=0, le=1)]
NonEmptyStr = Annotated[str, Strict(), Field(min_length=1)]
AutoBool = Annotated[bool | Literal["auto"], BeforeValidator(_true_false_or_auto)]  # auto: decided at start-up


class Section(BaseModel):
    """Base of every config section: unknown keys forbidden, assignments re-validated, defaults on every field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples stay tuples) for components that take dicts."""
        return self.model_dump()
