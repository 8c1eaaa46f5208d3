"""Reference-policy KL and checkpoint resume on 2 Ray workers (tiny FP8 config; one Ray start for both).

Reference KL (loss_fn.reference_policy_kl_penalty > 0): each worker holds a frozen copy of the loaded model taken
before the FP8 swap (`DataParallelPolicy`), as `NativePolicy` does in one process (test_reference_kl.py checks that
side by hand). The workers' references are the loaded weights before and after training, a batch scored again after
the updates gets the same reference logprobs bit for bit, and the Ray run's reference logprobs equal the single-
process run's bitwise, its KL / loss metrics to the tolerance of test_ray_workers.py (1e-5 relative).

Resume: a fresh Ray run started from the uninterrupted Ray run's step-1 checkpoint (and its metrics.jsonl, lines past
step 1 included, as a run killed later leaves it) runs steps 2..3 and ends bitwise where the uninterrupted run ended:
metrics.jsonl (timing keys dropped), the step-3 checkpoint (weights, AdamW state, LR schedule, FP8 KV scales) and the
reference logprobs (still the initial model's after the resume), as test_resume.py does for one process.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray is imported (DESIGN.md §5)
ray = pytest.importorskip("ray", reason="the `ray` extra is not installed (uv sync --extra ray)")

from jetrl_testkit.grpo_harness import record_train  # noqa: E402

from nemo_jetrl.algorithms import grpo  # noqa: E402
from nemo_jetrl.config import load_config  # noqa: E402
from nemo_jetrl.models.loading import load_model_and_tokenizer  # noqa: E402
from nemo_jetrl.schema import validate_config  # noqa: E402
from nemo_jetrl.utils.checkpoint import CheckpointManager  # noqa: E402

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_tiny.yaml"
BETA = 0.5
STEPS = 3
EXACT = ("reward_mean", "accuracy", "mean_response_length", "truncated_fraction", "kept_fraction")
RAY = ("cluster.backend=ray", "cluster.cpu_workers_per_node=2")
WARMUP = "{name:torch.optim.lr_scheduler.LinearLR,kwargs:{start_factor:0.5,end_factor:1.0,total_iters:4}}"


def _cfg(root: Path, *extra: str):
    overrides = [
        f"logger.log_dir={root / 'logs'}",
        f"checkpointing.checkpoint_dir={root / 'ckpt'}",
        "checkpointing.enabled=true",
        "checkpointing.save_period=1",
        "logger.tensorboard_enabled=false",
        f"grpo.max_num_steps={STEPS}",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.drop_zero_advantage_groups=false",  # every step trains, so the KL always reaches a loss
        "policy.train_micro_batch_size=8",  # 16 rows: one micro-batch per worker
        "policy.logprob_batch_size=8",  # the same logprob chunks in both layouts
        "policy.optimizer.lr=1e-3",  # the policy moves visibly away from the reference in one step
        f"policy.scheduler={WARMUP}",  # an LR schedule the resume must continue
        "policy.prev_logprobs_source=logprob_forward",  # both sides score every row
        f"loss_fn.reference_policy_kl_penalty={BETA}",
        "policy.generation.temperature=1.0",
        "cluster.num_cpu_threads=1",
        "cluster.rollout_seed_shards=2",  # the Ray run's shard count
        *extra,
    ]
    return validate_config(load_config(CONFIG, overrides))


def _on_worker(actor, fn):
    """`fn(worker)` run inside a `PolicyWorker` actor (Ray's `__ray_call__`); this module, which the workers cannot
    import, travels by value."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[fn.__module__])
    return ray.get(actor.__ray_call__.remote(fn), timeout=120)


def _worker_models(worker) -> dict:
    """Inside a worker: its reference's parameters (CPU), whether it is frozen, dtypes, FP8 module counts."""
    from nemo_jetrl.precision import Fp8Linear

    policy = worker.policy
    ref = policy.reference_model
    return {
        "params": {n: p.detach().cpu().clone() for n, p in ref.named_parameters()},
        "frozen": all(not p.requires_grad for p in ref.parameters()) and not ref.training,
        "dtypes": {p.dtype for p in ref.parameters()},
        "ref_fp8": sum(isinstance(m, Fp8Linear) for m in ref.modules()),
        "policy_fp8": sum(isinstance(m, Fp8Linear) for m in policy.model.modules()),
    }


def _run(cfg) -> dict:
    """run_grpo(cfg), recording every TrainBatch; Ray runs also snapshot the workers' references before step 1,
    and after the run re-score the first trained batch. The worker group is shut down before returning."""
    out: dict = {}
    real_setup = grpo.setup

    def spy(*args, **kwargs):
        run = real_setup(*args, **kwargs)
        out["run"], out["calls"] = run, record_train(run)
        if hasattr(run.policy, "group"):
            out["before"] = [_on_worker(a, _worker_models) for a in run.policy.group.actors]
        return run

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grpo, "setup", spy)
        out["history"] = grpo.run_grpo(cfg)["history"]
    run = out.pop("run")
    if hasattr(run.policy, "group"):
        out["after"] = [_on_worker(a, _worker_models) for a in run.policy.group.actors]
        first = out["calls"][0]
        out["rescored_ref"] = run.policy.get_reference_policy_logprobs(first)
        out["rescored_policy"] = run.policy.get_logprobs(first)
        run.policy.shutdown()
    del run
    gc.collect()
    return out


def _metrics(root: Path) -> list[tuple[int, dict]]:
    """(step, metrics) per metrics.jsonl line, in file order; timing keys (timing/..., ..._s, .../seconds) dropped."""
    rows = []
    for line in (root / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values = {k: v for k, v in record.items() if k != "step" and not k.startswith("timing/")}
        values = {k: v for k, v in values.items() if not k.endswith(("_s", "/seconds"))}
        if values:
            rows.append((record["step"], values))
    return rows


@pytest.fixture(scope="module")
def runs(ray_module, tmp_path_factory):
    """The single-process run, the uninterrupted Ray run, and a fresh Ray run resumed from its step-1 checkpoint."""
    tmp = tmp_path_factory.mktemp("ray_kl_resume")
    local = _run(_cfg(tmp / "local", "checkpointing.enabled=false"))
    dist = _run(_cfg(tmp / "ray", *RAY))
    (tmp / "resumed" / "ckpt").mkdir(parents=True)
    shutil.copytree(tmp / "ray" / "ckpt" / "step_1", tmp / "resumed" / "ckpt" / "step_1")
    shutil.copytree(tmp / "ray" / "logs", tmp / "resumed" / "logs")  # steps 2..3 logged: the resume drops them
    resumed = _run(_cfg(tmp / "resumed", *RAY))
    return tmp, local, dist, resumed


def test_ray_reference_is_the_loaded_model_before_fp8_and_stays_frozen(runs, ray_cluster):
    _, local, dist, _ = runs
    loaded, _ = load_model_and_tokenizer("tiny-arith", device=torch.device("cpu"), dtype=torch.float32)
    assert len(dist["before"]) == len(dist["after"]) == 2
    for rank, (before, after) in enumerate(zip(dist["before"], dist["after"])):
        assert before["ref_fp8"] == 0 and before["policy_fp8"] == 28, rank
        assert before["frozen"] and after["frozen"] and before["dtypes"] == {torch.float32}, rank
        assert sorted(after["params"]) == sorted(n for n, _ in loaded.named_parameters())
        for name, p in after["params"].items():
            assert torch.equal(before["params"][name], loaded.get_parameter(name)), f"rank {rank} {name}: not loaded"
            assert torch.equal(p, before["params"][name]), f"rank {rank} {name}: the reference moved in training"
    # the Ray reference logprobs are the single-process reference's (same rollout tokens, same logprob chunks)
    assert len(dist["calls"]) == len(local["calls"]) == STEPS
    for step, (mine, theirs) in enumerate(zip(dist["calls"], local["calls"])):
        assert torch.equal(mine.input_ids, theirs.input_ids), step
        assert torch.equal(mine.reference_logprobs, theirs.reference_logprobs), step
    # the step-1 batch scored again after the updates: the same reference logprobs, bit for bit ...
    first = dist["calls"][0]
    assert torch.equal(dist["rescored_ref"], first.reference_logprobs)
    # ... while the policy moved away from them
    moved = float((dist["rescored_policy"] - dist["rescored_ref"]).abs()[first.response_mask.bool()].max())
    assert moved > 0.05, moved


def test_ray_kl_and_loss_equal_the_single_process_run(runs, ray_cluster):
    _, local, dist, _ = runs
    for step, (want, got) in enumerate(zip(local["history"], dist["history"], strict=True)):
        assert want["kl_penalty"] > 1e-4, "no KL to check: the policy equals the reference"
        assert got["kl_penalty"] == pytest.approx(want["kl_penalty"], rel=1e-5, abs=1e-7), step
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7), step
        for key, value in want.items():
            if key.endswith(("_s", "/seconds")):
                continue
            if key in EXACT:
                assert got[key] == value, (step, key)
            else:
                assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
    assert dist["history"][1]["kl_penalty"] > 2 * dist["history"][0]["kl_penalty"]  # the update moved the policy


def test_resumed_ray_run_ends_bitwise_where_the_uninterrupted_run_ends(runs, ray_cluster):
    tmp, _, dist, resumed = runs
    assert len(resumed["calls"]) == STEPS - 1, "the resumed run should run steps 2..3 only"
    want, got = _metrics(tmp / "ray"), _metrics(tmp / "resumed")
    assert [s for s, _ in want] == list(range(1, STEPS + 1))
    assert [s for s, _ in got] == [s for s, _ in want]
    for (step, w), (_, g) in zip(want, got):  # exact float equality, every key (lr, loss, kl_penalty, grad_norm, ...)
        assert g.keys() == w.keys(), step
        assert {k: (v, g[k]) for k, v in w.items() if g[k] != v} == {}, f"step {step}: (uninterrupted, resumed)"
    for mine, theirs in zip(resumed["calls"], dist["calls"][1:]):
        assert torch.equal(mine.input_ids, theirs.input_ids)
        assert torch.equal(mine.reference_logprobs, theirs.reference_logprobs)  # still the initial model
        assert torch.equal(mine.prev_logprobs, theirs.prev_logprobs)
    a = CheckpointManager(tmp / "ray" / "ckpt").load_latest()
    b = CheckpointManager(tmp / "resumed" / "ckpt").load_latest()
    assert a["step"] == b["step"] == STEPS and b["data"] == a["data"]
    pa, pb = a["policy"], b["policy"]
    assert pa["step"] == pb["step"] == STEPS
    assert pb["lr_scheduler"] == pa["lr_scheduler"]
    assert pa["model"].keys() == pb["model"].keys()
    for name, value in pa["model"].items():
        assert torch.equal(pb["model"][name], value), name
    assert pb["optimizer"]["param_groups"] == pa["optimizer"]["param_groups"]
    assert pa["optimizer"]["state"].keys() == pb["optimizer"]["state"].keys()
    for i, state in pa["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(pb["optimizer"]["state"][i][key], value), (i, key)
    for n in ("q", "k", "v"):
        assert torch.equal(pb["kv_scales"][n], pa["kv_scales"][n]), n
