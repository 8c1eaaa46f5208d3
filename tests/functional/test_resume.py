"""Durability: kill-and-resume (a run SIGKILLed mid-step resumes from its last checkpoint and logs exactly the
metrics of an uninterrupted run, bitwise on CPU, timing keys excluded), the deadline save
(`checkpointing.checkpoint_must_save_by`: a spent budget saves after the first step and stops, and the continued run
logs exactly the uninterrupted run's metrics) and the NaN/Inf guard (a non-finite loss,
gradient, FP8 scale or reward stops the step before the optimizer; grpo.on_nonfinite skips the batch or stops)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nemo_jetrl.algorithms.grpo import grpo_step, run_grpo, setup
from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.environments import make_task
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.native import NativePolicy, NonFiniteError
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

REPO = Path(__file__).resolve().parents[2]
RUN_GRPO = REPO / "examples" / "run_grpo.py"
ARGS = [
    "--config",
    str(REPO / "examples" / "configs" / "grpo_tiny.yaml"),
    "grpo.max_num_steps=4",
    "grpo.num_prompts_per_step=8",
    "grpo.num_generations_per_prompt=4",
    "policy.train_micro_batch_size=32",
    "policy.logprob_batch_size=32",
    "grpo.val_period=2",
    "grpo.max_val_samples=8",
    "logger.tensorboard_enabled=false",
    "checkpointing.enabled=true",
    "checkpointing.save_period=2",
]


def _dirs(root: Path) -> list[str]:
    return [f"logger.log_dir={root / 'logs'}", f"checkpointing.checkpoint_dir={root / 'ckpt'}"]


def _start(root: Path) -> subprocess.Popen:
    args = [*ARGS, *_dirs(root)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(RUN_GRPO), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def _metrics(root: Path) -> list[tuple[int, dict]]:
    """(step, metrics) per metrics.jsonl line, timing keys dropped, in file order."""
    rows = []
    for line in (root / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values = {k: v for k, v in record.items() if k != "step" and not k.startswith("timing/")}
        if values:
            rows.append((record["step"], values))
    return rows


def _logged_steps(root: Path) -> set[int]:
    path = root / "logs" / "metrics.jsonl"
    if not path.is_file():
        return set()
    steps = set()
    for line in path.read_text().splitlines():
        try:
            steps.add(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass
    return steps


@pytest.mark.slow
def test_sigkill_mid_step_then_resume_matches_uninterrupted_run(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    victim = _start(killed)
    # the uninterrupted reference runs in this process meanwhile (same code, same 2 threads, same seeds)
    run_grpo(validate_config(load_config(ARGS[1], [*ARGS[2:], *_dirs(reference)])))
    deadline = time.monotonic() + 240
    # wait until step 3 is logged (so metrics.jsonl holds lines past the step-2 checkpoint), then kill mid-step 4
    while 3 not in _logged_steps(killed):
        assert victim.poll() is None, victim.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the run did not reach step 3 in time"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL
    assert (killed / "ckpt" / "step_2" / "meta.json").is_file()
    assert not (killed / "ckpt" / "step_4").exists()
    assert 3 in _logged_steps(killed)  # lines the resumed run must drop

    out = _finish(_start(killed))
    assert "resumed from step 2" in out
    assert "dropped" in out and "logged after step 2" in out

    ref_rows, resumed_rows = _metrics(reference), _metrics(killed)
    assert [s for s, _ in ref_rows] == [0, 1, 2, 2, 3, 4, 4]  # val@0, train@1..4, val@2, val@4
    assert resumed_rows == ref_rows  # exact float equality, every key
    assert sorted(p.name for p in (killed / "ckpt").glob("step_*")) == ["step_2", "step_4"]


# ------------------------------------------------------------------------------------------------ NaN / Inf guard
SMALL_RUN = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=16",
    "grpo.val_period=0",
    "grpo.val_at_start=false",
    "logger.tensorboard_enabled=false",
]


def _tiny_cfg(root: Path, *extra: str):
    overrides = [
        *SMALL_RUN,
        f"logger.log_dir={root / 'logs'}",
        "checkpointing.enabled=true",
        "checkpointing.save_period=1",
        f"checkpointing.checkpoint_dir={root / 'ckpt'}",
        *extra,
    ]
    return validate_config(load_config(REPO / "examples" / "configs" / "grpo_tiny.yaml", overrides))


def test_a_spent_save_deadline_saves_stops_and_the_next_run_continues_bitwise(tmp_path, capsys):
    steps = ("grpo.max_num_steps=3", "checkpointing.save_period=100")  # saves only at the deadline and the last step
    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    run_grpo(_tiny_cfg(reference, *steps))
    first = run_grpo(_tiny_cfg(stopped, *steps, "++checkpointing.checkpoint_must_save_by='00:00:00:00'"))
    out = "".join(capsys.readouterr())
    assert len(first["history"]) == 1
    assert "checkpoint_must_save_by (00:00:00:00) reached after step 1: saved step 1" in out
    assert sorted(p.name for p in (stopped / "ckpt").glob("step_*")) == ["step_1"]
    second = run_grpo(_tiny_cfg(stopped, *steps))  # no budget: runs to max_num_steps from the saved step
    assert len(second["history"]) == 2
    assert sorted(p.name for p in (stopped / "ckpt").glob("step_*")) == ["step_1", "step_3"]
    assert [s for s, _ in _metrics(stopped)] == [1, 2, 3]
    assert _metrics(stopped) == _metrics(reference)  # exact float equality, every key


@pytest.fixture(scope="module")
def policy():
    cfg = _tiny_cfg(Path("/nonexistent"))
    return NativePolicy(cfg.policy, PrecisionRecipe.preset("jetrl"), torch.device("cpu"))


LOSS_FN = ClippedPGLossFn(_tiny_cfg(Path("/nonexistent")).loss_fn)


def _batch(policy: NativePolicy, advantages: list[float]) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 16, (4, 9), generator=gen)
    response = torch.zeros(4, 9, dtype=torch.long)
    response[:, 6:] = 1
    batch = TrainBatch(ids, torch.ones_like(ids), response, torch.tensor(advantages), torch.zeros(4, 9))
    batch.prev_logprobs = policy.get_logprobs(batch)
    batch.generation_logprobs = batch.prev_logprobs.clone()
    return batch


def _snapshot(policy: NativePolicy):
    return (
        {k: v.clone() for k, v in policy.model.state_dict().items()},
        policy.step,
        repr(policy.optimizer.state_dict()),
    )


def _assert_untouched(policy: NativePolicy, before) -> None:
    weights, step, optimizer = before
    assert all(torch.equal(v, weights[k]) for k, v in policy.model.state_dict().items())
    assert policy.step == step and repr(policy.optimizer.state_dict()) == optimizer
    assert all(p.grad is None for p in policy.model.parameters())


def test_nonfinite_loss_stops_the_step_before_the_optimizer(policy):
    before = _snapshot(policy)
    with pytest.raises(NonFiniteError, match=r"non-finite loss \(micro-batch 0, value nan\) at trainer step 0"):
        policy.train(_batch(policy, [1.0, float("nan"), -1.0, 0.5]), LOSS_FN)
    _assert_untouched(policy, before)


def test_nonfinite_gradient_names_the_parameter(policy):
    before = _snapshot(policy)
    weight = policy.model.get_submodule("model.layers.1.mlp.up_proj").weight
    handle = weight.register_hook(lambda grad: grad * float("inf"))
    try:
        with pytest.raises(NonFiniteError, match=r"gradient of model\.layers\.1\.mlp\.up_proj\.weight") as err:
            policy.train(_batch(policy, [1.0, -1.0, 1.0, -1.0]), LOSS_FN)
    finally:
        handle.remove()
    assert err.value.tensor.startswith("gradient of model.layers.1.mlp.up_proj.weight")
    _assert_untouched(policy, before)


def test_nonfinite_fp8_scale_and_master_weight_are_caught_before_the_forward(policy):
    layer = policy.model.get_submodule("model.layers.0.self_attn.q_proj")
    before = _snapshot(policy)
    scale = layer.quantized_weight().scale
    saved = scale[0, 0].item()
    scale[0, 0] = float("nan")  # the cached scale the next forward would use
    with pytest.raises(NonFiniteError, match=r"non-finite FP8 weight scale of model\.layers\.0\.self_attn\.q_proj"):
        policy.train(_batch(policy, [1.0, -1.0, 1.0, -1.0]), LOSS_FN)
    scale[0, 0] = saved
    _assert_untouched(policy, before)
    with torch.no_grad():  # inf saturates to a finite scale: the master weight check catches it
        layer.weight[3, 5] = float("inf")
    try:
        with pytest.raises(NonFiniteError, match=r"master weight of FP8 layer model\.layers\.0\.self_attn\.q_proj"):
            policy.train(_batch(policy, [1.0, -1.0, 1.0, -1.0]), LOSS_FN)
    finally:
        with torch.no_grad():
            layer.weight[3, 5] = before[0]["model.layers.0.self_attn.q_proj.weight"][3, 5]


class NanRewardsAtStep:
    """Test task wrapper: the arithmetic task, with NaN rewards for the training batch of one step."""

    def __init__(self, inner, bad_step: int) -> None:
        self.inner, self.bad_step, self.current = inner, bad_step, -1

    def train_batch(self, step: int, n: int):
        self.current = step
        return self.inner.train_batch(step, n)

    def validation(self, max_n=None):
        return self.inner.validation(max_n)

    def score(self, responses, answers):
        rewards = self.inner.score(responses, answers)
        return torch.full_like(rewards, float("nan")) if self.current == self.bad_step else rewards


def _model_weights(root: Path, step: int) -> dict:
    return torch.load(root / "ckpt" / f"step_{step}" / "state.pt", weights_only=False)["policy"]["model"]


@pytest.mark.parametrize("mode", ["skip", "stop"])
def test_step_with_a_nonfinite_training_loss_skips_or_stops(tmp_path, mode):
    """NaN injected into the trainer's forward only (a grad-mode hook on lm_head): rollout and logprobs are fine
    (a separate logprob forward; with train_forward the same NaN shows as the trainer's logprobs, unit-tested)."""
    overrides = (f"grpo.on_nonfinite={mode}", "policy.prev_logprobs_source=logprob_forward")
    run = setup(_tiny_cfg(tmp_path, *overrides))
    head = run.policy.model.lm_head
    handle = head.register_forward_hook(lambda m, i, out: out * float("nan") if torch.is_grad_enabled() else None)
    before = _snapshot(run.policy)
    try:
        with RunProgress(1) as progress:
            if mode == "stop":
                with pytest.raises(NonFiniteError, match="non-finite loss"):
                    grpo_step(run, 0, Timer(), progress)
            else:
                metrics = grpo_step(run, 0, Timer(), progress)
                assert metrics["nonfinite_skipped"] == 1.0 and metrics["kept_fraction"] > 0
                assert "grad_norm" not in metrics
    finally:
        handle.remove()
        run.logger.close()
    _assert_untouched(run.policy, before)


def test_loop_skips_a_nonfinite_batch_and_goes_on(tmp_path, capsys):
    cfg = _tiny_cfg(tmp_path, "grpo.max_num_steps=3", "grpo.on_nonfinite=skip")
    task = NanRewardsAtStep(make_task(cfg.data, cfg.env), bad_step=1)
    history = run_grpo(cfg, task=task)["history"]
    assert [m["nonfinite_skipped"] for m in history] == [0.0, 1.0, 0.0]
    assert "non-finite rewards (16 of 16, from the environment)" in capsys.readouterr().err
    step1, step2, step3 = (_model_weights(tmp_path, s) for s in (1, 2, 3))
    assert all(torch.equal(step2[k], step1[k]) for k in step1)  # the skipped step left the weights alone
    assert any(not torch.equal(step3[k], step2[k]) for k in step2)  # the next step trained again


def test_loop_stops_on_a_nonfinite_batch_and_keeps_the_last_checkpoint(tmp_path):
    cfg = _tiny_cfg(tmp_path, "grpo.max_num_steps=3", "grpo.on_nonfinite=stop")
    task = NanRewardsAtStep(make_task(cfg.data, cfg.env), bad_step=1)
    with pytest.raises(NonFiniteError, match="non-finite rewards"):
        run_grpo(cfg, task=task)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_1"]
    state = torch.load(tmp_path / "ckpt" / "step_1" / "state.pt", weights_only=False)
    assert state["step"] == 1
    steps = [json.loads(line)["step"] for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 1  # nothing logged for the failed step
