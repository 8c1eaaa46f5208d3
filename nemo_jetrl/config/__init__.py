"""Config system: YAML with `defaults:` inheritance + Hydra-style overrides, validated by the composed schema."""

from nemo_jetrl.config.errors import ConfigError

__all__ = ["ConfigError", "MasterConfig", "load_config", "register_resolvers", "validate_config"]


def __getattr__(name: str):
    """Loader and schema on first use: section types beside the components import `nemo_jetrl.config.section`."""
    if name in ("load_config", "register_resolvers"):
        from nemo_jetrl.config import loader

        return getattr(loader, name)
    if name in ("MasterConfig", "validate_config"):
        from nemo_jetrl.config import schema

        return getattr(schema, name)
    raise AttributeError(f"module 'nemo_jetrl.config' has no attribute {name!r}")
