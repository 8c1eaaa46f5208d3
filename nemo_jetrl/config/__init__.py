"""Config system: YAML with `defaults:` inheritance + Hydra-style overrides, validated by a pydantic schema."""

from nemo_jetrl.config.errors import ConfigError
from nemo_jetrl.config.loader import load_config, register_resolvers
from nemo_jetrl.config.schema import MasterConfig, validate_config

__all__ = ["ConfigError", "MasterConfig", "load_config", "register_resolvers", "validate_config"]
