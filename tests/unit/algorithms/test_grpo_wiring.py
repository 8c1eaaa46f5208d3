"""The GRPO loop's wiring, end to end on the tiny model with a scripted task (jetrl_testkit.grpo_harness).

Over group sizes and the three advantage switches, the batch `policy.train` receives must hold exactly the kept
groups, each complete and contiguous, with the advantages recomputed (float64, formulas written out in the
harness) from the rewards of its OWN decoded rows; the reported reward metrics must be those of every sample.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from jetrl_testkit.grpo_harness import (
    ScriptedEngine,
    ScriptedTask,
    check_train_batch,
    decode_rows,
    record_train,
    reference_advantages,
    responses_by_prompt,
)

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.algorithms.config import RewardShapingConfig
from nemo_jetrl.config import load_config
from nemo_jetrl.environments.interfaces import Problem
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny_bf16.yaml"
NUM_PROMPTS = 6
# bf16 recipe in float32 compute: the rollout's logprobs and the trainer's are the same math (float32 rounding
# apart), so each row's logprobs must match its own tokens' (another sequence's are off by ~1 nat).
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    overrides = [
        f"logger.log_dir={tmp_path_factory.mktemp('wiring')}",
        "logger.tensorboard_enabled=false",
        f"grpo.num_prompts_per_step={NUM_PROMPTS}",
        "grpo.num_generations_per_prompt=4",
        "policy.train_micro_batch_size=6",  # micro-batches cut across groups of 4, 5 (and dropped ones)
        "policy.logprob_batch_size=7",
        "policy.compute_dtype=float32",
        "cluster.num_cpu_threads=1",
    ]
    cfg = validate_config(load_config(CONFIG, overrides))
    run = grpo.setup(cfg, task=ScriptedTask(const_every=3))
    run.calls = record_train(run)
    return run


SWITCHES = list(itertools.product([False, True], repeat=3))  # normalize, leave-one-out, drop zero-std groups


@pytest.mark.parametrize("group", [1, 2, 3, 5])
def test_train_batch_holds_each_group_with_its_own_advantages(run, group):
    _check_switches(run, group, SWITCHES)


@pytest.mark.parametrize("group", [2, 3])
def test_prev_logprobs_from_the_train_forward_stay_with_their_rows(run, group):
    """policy.prev_logprobs_source: train_forward fills prev_logprobs row by row inside train(): each row's must
    match its own rollout logprobs, and the step's mismatch metrics come from them."""
    run.cfg.policy.prev_logprobs_source = "train_forward"  # the policy holds the same section
    try:
        for metrics in _check_switches(run, group, [(True, False, True), (False, True, False)], first_step=100):
            assert metrics["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-4)
    finally:
        run.cfg.policy.prev_logprobs_source = "logprob_forward"


def _check_switches(run, group, switches, first_step=0) -> list[dict[str, float]]:
    out = []
    for step, (normalize, loo, drop) in enumerate(switches, start=first_step):
        g = run.cfg.grpo
        g.num_generations_per_prompt, g.normalize_rewards = group, normalize
        g.use_leave_one_out_baseline, g.drop_zero_advantage_groups = loo, drop
        run.cfg.policy.train_global_batch_size = NUM_PROMPTS * group  # one optimizer step per GRPO step
        step += 10 * group  # fresh prompts and sampling seeds per case
        before = len(run.calls)
        run.next_batch = step  # the data batch this step draws (one per step without dynamic sampling)
        metrics = grpo.grpo_step(run, step, Timer(), RunProgress(1, enabled=False))
        problems = run.task.prompts(step, NUM_PROMPTS)
        responses = responses_by_prompt(run.task, problems)
        batch = run.calls[-1] if len(run.calls) > before else None
        found = check_train_batch(batch, run.policy.tokenizer, g, problems, responses, logprob_atol=LOGPROB_ATOL)
        every = [r for p in problems for r in found.rewards[p.prompt]]
        assert metrics["reward_mean"] == pytest.approx(sum(every) / len(every), abs=1e-6), (group, step)
        assert metrics["kept_fraction"] == pytest.approx(len(found.kept_prompts) / NUM_PROMPTS)
        if drop:  # constant prompts (every third) are always dropped
            assert len(found.kept_prompts) <= NUM_PROMPTS - NUM_PROMPTS // 3
        elif group > 1:
            assert len(found.kept_prompts) == NUM_PROMPTS
        if batch is not None and group > 2 and not drop:
            assert (batch.advantages != 0).sum() > group, "too few nonzero advantages to test the pairing"
        out.append(metrics)
    return out


class FirstDigitTask:
    """Three fixed prompts; a response's reward is its first digit / 8 (exact in float32)."""

    PROMPTS = ("1+1=", "12+3=", "4+56=")

    def train_batch(self, step: int, n: int) -> list[Problem]:
        return [Problem(prompt=p, answer="") for p in self.PROMPTS[:n]]

    def score(self, responses, answers) -> torch.Tensor:
        return torch.tensor([int(r[0]) / 8 for r in responses], dtype=torch.float32)


def test_zero_advantage_groups_are_dropped_on_the_shaped_rewards(run):
    """Overlong shaping (max_response_length 4, buffer 4, penalty 1: -L / 4 for L tokens with the stop token) over
    scripted responses: "2"/"22" (raw 0.25, 0.25) shapes to -0.25, -0.5 (kept: its advantages are not zero);
    "2"/"44" (raw 0.25, 0.5) shapes to -0.25, -0.25 (dropped). Filtering on the raw rewards would do the opposite."""
    a, b, c = FirstDigitTask.PROMPTS
    script = {a: ["2", "6"], b: ["2", "22"], c: ["2", "44"]}
    shaped = {a: [-0.25, 0.25], b: [-0.25, -0.5], c: [-0.25, -0.25]}
    saved = (run.engine, run.task, run.cfg)
    run.cfg = run.cfg.model_copy(deep=True)  # this step's settings; the fixture's config comes back after it
    g = run.cfg.grpo
    g.num_prompts_per_step, g.num_generations_per_prompt, g.use_dynamic_sampling = 3, 2, False
    g.normalize_rewards, g.use_leave_one_out_baseline, g.drop_zero_advantage_groups = True, False, True
    shaping = dict(enabled=True, overlong_buffer_length=4, overlong_buffer_penalty=1.0, max_response_length=4)
    g.reward_shaping = RewardShapingConfig(**shaping)
    run.cfg.policy.train_global_batch_size = 6
    run.engine, run.task = ScriptedEngine(run.engine, run.policy.tokenizer, script), FirstDigitTask()
    before = len(run.calls)
    try:
        run.next_batch = 0
        metrics = grpo.grpo_step(run, 0, Timer(), RunProgress(1, enabled=False))
    finally:
        run.engine, run.task, run.cfg = saved
    assert len(run.calls) == before + 1
    batch = run.calls[-1]
    rows = decode_rows(batch, run.policy.tokenizer)
    assert rows == [(a, "2"), (a, "6"), (b, "2"), (b, "22")]
    expected = reference_advantages(shaped[a], False, True) + reference_advantages(shaped[b], False, True)
    torch.testing.assert_close(batch.advantages.double(), torch.tensor(expected, dtype=torch.float64))
    assert metrics["kept_fraction"] == pytest.approx(4 / 6)
    assert metrics["reward_mean"] == pytest.approx(sum(sum(v) for v in shaped.values()) / 6)  # shaped, every sample
