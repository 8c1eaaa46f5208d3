"""Rollout engines behind one interface (native now), in the shared sequence layout."""

from nemo_jetrl._lazy import lazy_exports

_EXPORTS = {
    "GenerationInterface": "interfaces",
    "GenerationOutput": "interfaces",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
