"""`RunConfig`: the validated config a GRPO run holds from validation to its end, as the algorithms read it.

The composed `MasterConfig` (`nemo_jetrl.schema`, the top floor) is the type that has these sections; the loop
names this Protocol instead of importing it (imports point down). `run_config` refuses a plain dict: dicts exist
only where the config crosses a process boundary (Ray workers, checkpoints, logs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nemo_jetrl.config.typed import typed_section

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.config import GrpoConfig, LossConfig
    from nemo_jetrl.data.config import DataConfig
    from nemo_jetrl.distributed.cluster_config import ClusterConfig
    from nemo_jetrl.environments.config import EnvConfig
    from nemo_jetrl.policy.config import PolicyConfig
    from nemo_jetrl.utils.config import CheckpointingConfig, LoggerConfig


class RunConfig(Protocol):
    """The sections of a validated `MasterConfig` (attributes, typed)."""

    grpo: GrpoConfig
    loss_fn: LossConfig
    policy: PolicyConfig
    data: DataConfig
    env: EnvConfig
    logger: LoggerConfig
    checkpointing: CheckpointingConfig
    cluster: ClusterConfig

    def model_dump(self) -> dict[str, Any]: ...


def run_config(cfg: Any, where: str) -> RunConfig:
    """`cfg` when it is the validated `MasterConfig`; a TypeError naming it otherwise (a dict, a section)."""
    return typed_section(cfg, "MasterConfig", where)
