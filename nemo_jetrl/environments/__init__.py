"""Verifiable tasks: prompts, held-out sets and rewards computed from decoded text."""

from nemo_jetrl._lazy import lazy_exports

_EXPORTS = {
    "ArithmeticTask": "arithmetic",
    "KNOWN_TASKS": "factory",
    "LongAdditionTask": "long_addition",
    "LongMultiplicationTask": "long_multiplication",
    "make_task": "factory",
    "Problem": "interfaces",
    "VerifiableTask": "interfaces",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
