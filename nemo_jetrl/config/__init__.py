"""Config system, the ground floor: YAML with `defaults:` inheritance + Hydra-style overrides (`load_config`), the
section base types (`section.py`) and errors that name keys. The composed schema sits at the top of the package
(`nemo_jetrl.schema`: `MasterConfig`, `validate_config`)."""

from nemo_jetrl.config.errors import ConfigError

__all__ = ["ConfigError", "load_config", "register_resolvers"]


def __getattr__(name: str):
    """The loader on first use: section types beside the components import `config.section` alone."""
    if name in ("load_config", "register_resolvers"):
        from nemo_jetrl.config import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'nemo_jetrl.config' has no attribute {name!r}")
