"""Run-level hardening (issue 14): a crafted checkpoint never runs code (resume or export), non-finite weights are
caught before any save, a fresh run never appends to an old metrics.jsonl, start-up checks fail before the first
step, user-caused errors (unfit checkpoints, a full disk at save time, a locked directory) are one line."""

from __future__ import annotations

import errno
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nemo_jetrl.algorithms.preflight as preflight
import nemo_jetrl.utils.checkpoint as checkpoint_module
from nemo_jetrl.algorithms.grpo import grpo_step, run_grpo, setup
from nemo_jetrl.environments import make_task
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.policy.native import NativePolicy, NonFiniteError, NonFiniteStateError
from nemo_jetrl.utils.checkpoint import CheckpointManager
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

from .test_resume import REPO, SMALL_RUN, _assert_untouched, _snapshot, _tiny_cfg  # noqa: E402

_SAFETY = REPO / "tests" / "unit" / "utils" / "test_checkpoint_safety.py"
_spec = importlib.util.spec_from_file_location("checkpoint_safety_helpers", _SAFETY)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
plant_malicious_checkpoint = _helpers.plant_malicious_checkpoint

TINY = REPO / "examples" / "configs" / "grpo_tiny.yaml"
SMALL = [*SMALL_RUN, "checkpointing.save_period=1"]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _cli(root: Path, *extra: str, log_dir: Path | None = None, ckpt: Path | None = None) -> list[str]:
    dirs = [f"logger.log_dir={log_dir or root / 'logs'}", f"checkpointing.checkpoint_dir={ckpt or root / 'ckpt'}"]
    return ["--config", str(TINY), *SMALL, "checkpointing.enabled=true", *dirs, *extra]


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _train_lines(root: Path) -> list[dict]:
    path = root / "logs" / "metrics.jsonl"
    lines = [json.loads(s) for s in path.read_text().splitlines()] if path.is_file() else []
    return [x for x in lines if any(k.startswith("train/") for k in x)]


# ---------------------------------------------------------------------------------------------- 1: safe loading
def test_crafted_checkpoint_runs_no_code_on_resume_or_export(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    marker = tmp_path / "pwned"
    plant_malicious_checkpoint(tmp_path / "ckpt", 2, marker)
    assert _script("run_grpo")(_cli(tmp_path, "grpo.max_num_steps=3")) == 1
    _one_line_error(capsys, "needs posix.system unpickled", "refused, nothing in it ran")
    assert not marker.exists() and not _train_lines(tmp_path)
    export = _script("export_hf")
    assert export(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]) == 2
    _one_line_error(capsys, "needs posix.system unpickled")
    assert not marker.exists() and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- 2: state guard
@pytest.mark.slow
def test_nan_in_a_master_weight_after_a_step_is_caught_before_any_save(tmp_path, monkeypatch):
    cfg = _tiny_cfg(tmp_path, "grpo.max_num_steps=3", "grpo.on_nonfinite=skip", "checkpointing.keep_top_k=1")
    train = NativePolicy.train

    def train_then_corrupt(self, batch, loss_fn):
        out = train(self, batch, loss_fn)
        if self.step == 2:  # an optimizer step that produced a NaN weight
            with torch.no_grad():
                self.model.get_submodule("model.layers.0.mlp.up_proj").weight[1, 2] = float("nan")
        return out

    monkeypatch.setattr(NativePolicy, "train", train_then_corrupt)
    with pytest.raises(NonFiniteStateError, match=r"non-finite master weight model\.layers\.0\.mlp\.up_proj\.weight"):
        run_grpo(cfg)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_1"]  # the good one survives
    state = CheckpointManager(tmp_path / "ckpt").load_latest()
    assert state["step"] == 1 and checkpoint_module.first_nonfinite(state) is None


class ConstantRewards:
    """The arithmetic task with all-equal rewards: no group is kept, train() is skipped."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def train_batch(self, step, n):
        return self.inner.train_batch(step, n)

    def validation(self, max_n=None):
        return self.inner.validation(max_n)

    def score(self, responses, answers):
        return torch.zeros(len(responses))


def test_guard_runs_when_no_group_is_kept(tmp_path, monkeypatch):
    cfg = _tiny_cfg(tmp_path)
    run = setup(cfg, ConstantRewards(make_task(cfg.data, cfg.env)))
    weight = run.policy.model.get_submodule("model.layers.2.self_attn.o_proj").weight
    get_logprobs = run.policy.get_logprobs

    def logprobs_then_corrupt(batch):  # finite logprobs; the weight goes bad afterwards
        out = get_logprobs(batch)
        with torch.no_grad():
            weight[0, 0] = float("inf")
        return out

    monkeypatch.setattr(run.policy, "get_logprobs", logprobs_then_corrupt)
    def train_nothing(steps, loss_fn):  # train() still runs once per GRPO step (its LR step); it must get no rows
        assert steps == [], "train() got rows although no group was kept"
        return {}

    monkeypatch.setattr(run.policy, "train", train_nothing)
    try:
        with (
            RunProgress(1) as progress,
            pytest.raises(NonFiniteStateError, match=r"o_proj\.weight after trainer step 0"),
        ):
            grpo_step(run, 0, Timer(), progress)
    finally:
        run.logger.close()


@pytest.mark.parametrize("mode", ["skip", "stop"])
def test_tiny_temperature_nonfinite_logprobs_skip_or_stop(tmp_path, mode):
    # The config refuses temperatures below 1e-6; the guard must still hold for a config built in code.
    cfg = _tiny_cfg(tmp_path, f"grpo.on_nonfinite={mode}")
    cfg.policy.generation.__dict__["temperature"] = 1e-45  # past the section's check, as code can set it
    run = setup(cfg)
    before = _snapshot(run.policy)
    try:
        with RunProgress(1) as progress:
            if mode == "stop":
                with pytest.raises(NonFiniteError, match=r"non-finite rollout logprobs \(\d+ of \d+ generated"):
                    grpo_step(run, 0, Timer(), progress)
            else:
                assert grpo_step(run, 0, Timer(), progress)["nonfinite_skipped"] == 1.0
    finally:
        run.logger.close()
    _assert_untouched(run.policy, before)


# ---------------------------------------------------------------------------------------------- 4: run-dir lock
def test_second_run_on_a_locked_checkpoint_dir_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    hold = (
        "import sys, time; from nemo_jetrl.utils.run_lock import RunDirLock; "
        "RunDirLock(sys.argv[1], 'x').acquire(); print('locked', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "ckpt")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert _script("run_grpo")(_cli(tmp_path, "grpo.max_num_steps=1")) == 1
        _one_line_error(capsys, "checkpointing.checkpoint_dir", f"in use by another run (pid {holder.pid} on ")
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "logs" / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------------- 5: metrics.jsonl
@pytest.mark.slow
def test_fresh_run_moves_an_old_metrics_file_aside(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    old = '{"step": 7, "train/reward_mean": 0.9}\n'
    (logs / "metrics.jsonl").write_text(old)
    cfg = _tiny_cfg(tmp_path, "grpo.max_num_steps=1", "checkpointing.enabled=false")
    run_grpo(cfg)
    steps = [json.loads(s)["step"] for s in (logs / "metrics.jsonl").read_text().splitlines()]
    assert 7 not in steps and 1 in steps
    (moved,) = [p for p in logs.glob("metrics.*.jsonl")]
    assert moved.read_text() == old


# ---------------------------------------------------------------------------------------------- 6: start-up checks
def test_empty_validation_set_fails_before_any_step(tmp_path):
    cfg = _tiny_cfg(tmp_path, "grpo.max_num_steps=2", "grpo.val_period=1", "grpo.val_at_start=false")
    task = make_task(cfg.data, cfg.env)
    task.validation = lambda max_n=None: []
    with pytest.raises(ValueError, match="the validation set is empty"):
        run_grpo(cfg, task=task)
    assert not _train_lines(tmp_path) and not list((tmp_path / "ckpt").glob("step_*"))


@pytest.mark.parametrize("which", ["log_dir", "checkpoint_dir"])
def test_unwritable_output_dir_fails_before_any_step(tmp_path, capsys, monkeypatch, which):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    where = {which: blocker / "sub"}
    args = _cli(tmp_path, "grpo.max_num_steps=1", log_dir=where.get("log_dir"), ckpt=where.get("checkpoint_dir"))
    assert _script("run_grpo")(args) == 1
    _one_line_error(capsys, f"{which}=", "is not writable (Not a directory)")
    assert not _train_lines(tmp_path)


def test_too_little_free_space_fails_before_any_step(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    usage = preflight.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage._replace(free=5 << 20))
    assert _script("run_grpo")(_cli(tmp_path, "grpo.max_num_steps=1")) == 1
    _one_line_error(capsys, "logger.log_dir=", "has 5 MiB free, 64 MiB needed")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    assert _script("run_grpo")(_cli(tmp_path, "cluster.device=cuda")) == 1
    _one_line_error(capsys, "cluster.device: 'cuda' was asked for but no CUDA device is visible")


# ---------------------------------------------------------------------------------------------- 7: one-line errors
def _wrong_shape_state() -> dict:
    model, _ = load_model_and_tokenizer("tiny-arith")
    weights = dict(model.state_dict())
    weights["model.embed_tokens.weight"] = torch.zeros(3, 3)
    return {"step": 1, "policy": {"model": weights, "optimizer": {}, "step": 1}}


@pytest.mark.parametrize(
    "make_state, needle",
    [
        (_wrong_shape_state, "size mismatch for model.embed_tokens.weight"),
        (lambda: {"step": 1}, "KeyError: 'policy'"),
    ],
)
def test_unfit_checkpoint_is_one_line(tmp_path, capsys, monkeypatch, make_state, needle):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    CheckpointManager(tmp_path / "ckpt").save(1, make_state())
    assert _script("run_grpo")(_cli(tmp_path, "grpo.max_num_steps=2")) == 1
    _one_line_error(capsys, "does not fit this run", needle)


@pytest.mark.slow
def test_disk_full_at_save_time_is_one_line_and_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    save = checkpoint_module.torch.save
    calls = []

    def second_save_fails(obj, f):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        save(obj, f)

    monkeypatch.setattr(checkpoint_module.torch, "save", second_save_fails)
    assert _script("run_grpo")(_cli(tmp_path, "grpo.max_num_steps=3")) == 1
    _one_line_error(capsys, "could not save checkpoint step_2", "No space left on device", "earlier checkpoints")
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith(".nemo")) == ["step_1"]
    assert CheckpointManager(tmp_path / "ckpt").load_latest()["step"] == 1
