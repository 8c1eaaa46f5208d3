"""Config system, the ground floor: YAML with `defaults:` inheritance + Hydra-style overrides (`load_config`), the
section base types (`section.py`) and errors that name keys. The composed schema sits at the top of the package
(`nemo_jetrl.schema`); `MasterConfig` and `validate_config` are handed out from there on first use."""

from nemo_jetrl.config.errors import ConfigError

__all__ = ["ConfigError", "MasterConfig", "load_config", "register_resolvers", "validate_config"]


def __getattr__(name: str):
    """Loader and composed schema on first use: section types beside the components import `config.section`."""
    if name in ("load_config", "register_resolvers"):
        from nemo_jetrl.config import loader

        return getattr(loader, name)
    if name in ("MasterConfig", "validate_config"):
        import nemo_jetrl.schema  # the top floor: the public names of this package before the split, kept

        return getattr(nemo_jetrl.schema, name)
    raise AttributeError(f"module 'nemo_jetrl.config' has no attribute {name!r}")
