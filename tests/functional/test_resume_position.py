"""A real resume with dynamic sampling: 2 steps straight vs 1 step, resume from its checkpoint, 1 step.

Every generation batch of the scripted task holds one constant group (dropped by dynamic sampling) and one varying
group, so each step draws at least two batches: the data position after step s is >= 2 s, not s. The task also
draws its prompts' operands from the global Python, NumPy and torch RNGs (as a user's data shuffler may), so the
resumed run draws the same prompts only when the checkpoint's RNG states come back. The resumed step must equal
the uninterrupted run's second step: same data batches, same draws, same metrics (bitwise, timings aside).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from jetrl_testkit.grpo_harness import ScriptedTask

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.environments.interfaces import Problem
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_tiny_bf16.yaml"


class GlobalRngTask(ScriptedTask):
    """ScriptedTask (every second prompt constant) whose operands come from the global RNGs; records each
    `train_batch(index)` call and its draws."""

    def __init__(self) -> None:
        super().__init__(const_every=2)
        self.drawn: list[tuple[int, list[int]]] = []

    def train_batch(self, step: int, n: int) -> list[Problem]:
        draws = [random.randrange(100), int(np.random.randint(100)), int(torch.randint(100, ()))]
        self.drawn.append((step, draws))
        return [Problem(prompt=f"{d}+{p.prompt}", answer=p.answer) for d, p in zip(draws, self.prompts(step, n))]


def _run(root: Path, steps: int) -> tuple[GlobalRngTask, list[dict]]:
    overrides = [
        f"logger.log_dir={root / 'logs'}",
        f"checkpointing.checkpoint_dir={root / 'ckpt'}",
        "checkpointing.enabled=true",
        "checkpointing.save_period=1",
        "logger.tensorboard_enabled=false",
        "logger.plot_period=0",
        f"grpo.max_num_steps={steps}",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "grpo.use_dynamic_sampling=true",
        "grpo.batch_multiplier=1",
        "grpo.dynamic_sampling_max_gen_batches=8",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "policy.train_micro_batch_size=8",
        "policy.logprob_batch_size=8",
        "cluster.num_cpu_threads=1",
    ]
    random.seed(5)  # a fresh process's global RNGs: the same at every start (torch's: NativePolicy seeds it)
    np.random.seed(5)
    task = GlobalRngTask()
    history = grpo.run_grpo(validate_config(load_config(CONFIG, overrides)), task=task)["history"]
    return task, [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in history]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_position")
    straight = _run(root / "straight", 2)
    (root / "resumed" / "ckpt").mkdir(parents=True)
    shutil.copytree(root / "straight" / "ckpt" / "step_1", root / "resumed" / "ckpt" / "step_1")
    saved = torch.load(root / "resumed" / "ckpt" / "step_1" / "state.pt", weights_only=False)
    return {"straight": straight, "resumed": _run(root / "resumed", 2), "saved": saved}


def test_resume_takes_the_data_position_from_the_checkpoint(runs):
    (task, _), (resumed, _) = runs["straight"], runs["resumed"]
    first = [b for b, _ in task.drawn if b < runs["saved"]["data"]["next_batch"]]
    assert len(first) >= 2 and runs["saved"]["data"]["next_batch"] == len(first)  # step 1 drew >= 2 batches
    assert [b for b, _ in resumed.drawn] == [b for b, _ in task.drawn[len(first) :]]


def test_resume_restores_the_global_rngs_and_continues_bitwise(runs):
    (task, history), (resumed, resumed_history) = runs["straight"], runs["resumed"]
    step1 = runs["saved"]["data"]["next_batch"]
    assert resumed.drawn == task.drawn[step1:]  # the same Python / NumPy / torch draws as the straight run's step 2
    assert len(history) == 2 and len(resumed_history) == 1
    assert resumed_history[0] == history[1]  # every metric, exact
    assert history[1]["dynamic_sampling_num_gen_batches"] == len(task.drawn) - step1
