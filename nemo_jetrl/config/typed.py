"""`typed_section`: the one check that a component was handed its validated config section (a `Section` subclass
such as `PolicyConfig`), not the section's plain dict. Plain dicts exist only where a config crosses a process
boundary (Ray workers, checkpoints, logs), dumped with `model_dump()`; a side that builds from one validates it back
(`distributed.worker.worker_sections`, `algorithms.grpo_checkpoint.saved_policy_config`).

Imports nothing (the GPU-side modules that call it import without pydantic): the expected type is named, not
imported, and matched against the value's class and its bases.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def typed_section(value: T, expected: str, where: str) -> T:
    """`value` when it is a `expected` (a class of that name, or a subclass of one); else a TypeError naming the type
    `where` (the caller, e.g. "PrecisionRecipe.from_config") expects and how to build it from a dict."""
    if any(cls.__name__ == expected for cls in type(value).__mro__):
        return value
    raise TypeError(
        f"{where} expects the validated config section {expected}, got {type(value).__name__}: build it with "
        f"{expected}.model_validate(...) (or take it from the validated MasterConfig)"
    )
