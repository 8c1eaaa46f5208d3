"""`Section`, the base of every config section type, and the strict value types the sections use.

Each component owns its section type beside its code (algorithms/config.py, policy/config.py, ...); the master
schema (nemo_jetrl/schema/master.py) composes them. Defaults live in these types only: a partial config is valid.

Values are strict: integers reject booleans and floats (`true` is not 1), floats reject booleans, infinities and NaN.
Integers are bounded by what the run can use, so a typo is refused naming its key instead of failing mid-run:
counts (prompts, steps, batch and token sizes, ...) by `MAX_COUNT` (int32, the range of tensor sizes and indices
the kernels take), seeds by `MAX_SEED` (numpy's and vLLM's 32-bit seeds), byte sizes by int64. Paths must not be
empty or blank (an empty path would silently mean the working directory).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict

MAX_COUNT = 2**31 - 1
MAX_SEED = 2**32 - 1
MAX_BYTES = 2**63 - 1


def _reject_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError(f"{value!r} is empty: give a directory (an empty path would mean the working directory)")
    return value


def _true_false_or_auto(value: Any) -> Any:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"{value!r}: expected true, false or auto")


StrictInt = Annotated[int, Strict(), Field(ge=-MAX_COUNT, le=MAX_COUNT)]
PositiveInt = Annotated[int, Strict(), Field(gt=0, le=MAX_COUNT)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
Seed = Annotated[int, Strict(), Field(ge=0, le=MAX_SEED)]
ByteCount = Annotated[int, Strict(), Field(gt=0, le=MAX_BYTES)]
FiniteFloat = Annotated[float, BeforeValidator(_reject_bool), Field(allow_inf_nan=False)]
PositiveFloat = Annotated[FiniteFloat, Field(gt=0)]
NonNegativeFloat = Annotated[FiniteFloat, Field(ge=0)]
UnitFloat = Annotated[FiniteFloat, Field(ge=0, le=1)]
NonEmptyStr = Annotated[str, Strict(), Field(min_length=1)]
PathStr = Annotated[str, Strict(), AfterValidator(_not_blank)]
AutoBool = Annotated[bool | Literal["auto"], BeforeValidator(_true_false_or_auto)]  # auto: decided at start-up


class Section(BaseModel):
    """Base of every config section: unknown keys forbidden, assignments re-validated, defaults on every field.
    Components take the typed sections (`config.typed.typed_section` refuses a dict); `model_dump()` gives the
    plain dict only where a config crosses a process boundary (Ray workers, checkpoints, logs)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
