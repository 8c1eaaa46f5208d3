"""What one GRPO run holds (built by `grpo.setup`, read by the loop, the rollout helpers and the evaluator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.algorithms.run_config import RunConfig
from nemo_jetrl.generation.interfaces import GenerationInterface
from nemo_jetrl.policy.interfaces import PolicyInterface
from nemo_jetrl.utils.checkpoint import CheckpointManager
from nemo_jetrl.utils.logger import Logger


@dataclass
class GrpoSetup:
    """Everything one GRPO run holds."""

    cfg: RunConfig  # the validated MasterConfig, typed sections from validation to the end of the run
    policy: PolicyInterface
    engine: GenerationInterface
    loss_fn: ClippedPGLossFn
    task: Any
    logger: Logger
    checkpoints: CheckpointManager | None
    device: torch.device
    is_main: bool = True  # logs, prints and writes checkpoints (torchrun: rank 0; the others run silently)
    startup: str | None = None  # how the run is spread over ranks (torchrun), printed at start
    next_batch: int = 0  # the next training data batch (dynamic sampling draws several per step)
    reference_engine: Any = None  # grpo.val_reference's BF16 referee (validation.reference_engine); False: none needed
