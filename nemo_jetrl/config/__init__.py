"""Config system, the ground floor: YAML with `defaults:` inheritance + Hydra-style overrides (`load_config`), the
section base types (`section.py`) and errors that name keys. The composed schema sits at the top of the package
(`nemo_jetrl.schema`: `MasterConfig`, `validate_config`). Nothing is imported eagerly: `config.typed` (the check
that a component got its typed section) imports without pydantic, for the GPU-side modules."""

from nemo_jetrl._lazy import lazy_exports

_EXPORTS = {"ConfigError": "errors", "load_config": "loader", "register_resolvers": "loader"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
