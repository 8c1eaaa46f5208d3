"""`validate_config`: a loaded config tree -> the validated `MasterConfig`, NeMo-RL's keys translated first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from nemo_jetrl.config.errors import ConfigError, format_validation_error, omegaconf_message
from nemo_jetrl.schema.master import MasterConfig
from nemo_jetrl.schema.nemo_rl import translate_nemo_rl


def validate_config(cfg: DictConfig | Mapping[str, Any]) -> MasterConfig:
    """Validate a (resolved or resolvable) config against `MasterConfig`; one ConfigError naming every bad key.

    NeMo-RL keys are honoured (mapped onto ours), accepted as no-op or refused first (schema/nemo_rl.py)."""
    if isinstance(cfg, ListConfig):
        raise ConfigError("config must be a mapping of sections, got a list")
    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as exc:
            message = omegaconf_message(exc)
            raise ConfigError(f"{exc.full_key}: {message}" if exc.full_key else message) from None
    elif isinstance(cfg, Mapping):
        data = dict(cfg)
    else:
        raise ConfigError(f"config must be a mapping of sections, got {type(cfg).__name__}")
    translation = translate_nemo_rl(data)
    try:
        cfg = MasterConfig.model_validate(translation.tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, MasterConfig)) from None
    cfg._notes, cfg._warnings = tuple(translation.notes), tuple(translation.warnings)
    return cfg
