"""Reference-policy KL (loss_fn.reference_policy_kl_penalty > 0) on 2 Ray workers vs one process, tiny FP8 config.

Each worker holds a frozen copy of the loaded model taken before the FP8 swap (`DataParallelPolicy`), as
`NativePolicy` does in one process (tests/functional/test_reference_kl.py checks the local side by hand). Here:
the workers' references are the loaded weights before and after training, a batch scored again after two updates
gets the same reference logprobs bit for bit, and the Ray run's reference logprobs and KL / loss metrics equal the
single-process run's (the tolerance of test_ray_workers.py: rollout bitwise, training metrics 1e-5 relative).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray is imported (DESIGN.md §5)
ray = pytest.importorskip("ray", reason="the `ray` extra is not installed (uv sync --extra ray)")

from jetrl_testkit.grpo_harness import record_train  # noqa: E402
from jetrl_testkit.ray_cluster import on_worker, ray_cluster, ray_module  # noqa: E402, F401

from nemo_jetrl.algorithms import grpo  # noqa: E402
from nemo_jetrl.config import load_config, validate_config  # noqa: E402
from nemo_jetrl.models.loading import load_model_and_tokenizer  # noqa: E402
from nemo_jetrl.utils.progress import RunProgress  # noqa: E402
from nemo_jetrl.utils.timers import Timer  # noqa: E402

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_tiny.yaml"
BETA = 0.5
EXACT = ("reward_mean", "accuracy", "mean_response_length", "truncated_fraction", "kept_fraction")


def _cfg(tmp: Path, *extra: str) -> dict:
    overrides = [
        f"logger.log_dir={tmp}",
        "logger.tensorboard_enabled=false",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.drop_zero_advantage_groups=false",  # every step trains, so the KL always reaches a loss
        "policy.train_micro_batch_size=8",  # 16 rows: one micro-batch per worker
        "policy.logprob_batch_size=8",  # the same logprob chunks in both layouts
        "policy.optimizer.lr=1e-3",  # the policy moves visibly away from the reference in one step
        "policy.prev_logprobs_source=logprob_forward",  # both sides score every row
        f"loss_fn.reference_policy_kl_penalty={BETA}",
        "policy.generation.temperature=1.0",
        "cluster.num_cpu_threads=1",
        "cluster.rollout_seed_shards=2",  # the Ray run's shard count
        *extra,
    ]
    return validate_config(load_config(CONFIG, overrides)).model_dump()


def _two_steps(cfg: dict):
    run = grpo.setup(cfg)
    calls = record_train(run)
    metrics = [grpo.grpo_step(run, step, Timer(), RunProgress(1, enabled=False)) for step in range(2)]
    return run, calls, metrics


def _worker_models(worker) -> dict:
    """Inside a worker: its reference's parameters (CPU), their dtypes / grad flags, and the module kinds."""
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


@pytest.fixture(scope="module")
def runs(ray_module, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray_kl")
    local = _two_steps(_cfg(tmp / "local"))
    dist_cfg = _cfg(tmp / "ray", "cluster.backend=ray", "cluster.cpu_workers_per_node=2")
    dist = grpo.setup(dist_cfg)
    before = [on_worker(a, _worker_models) for a in dist.policy.group.actors]
    calls = record_train(dist)
    metrics = [grpo.grpo_step(dist, step, Timer(), RunProgress(1, enabled=False)) for step in range(2)]
    yield local, (dist, calls, metrics), before
    dist.policy.shutdown()


def test_ray_reference_is_the_loaded_model_before_fp8_and_stays_frozen(runs, ray_cluster):
    (local, local_calls, _), (dist, calls, _), before = runs
    loaded, _ = load_model_and_tokenizer("tiny-arith", device=torch.device("cpu"), dtype=torch.float32)
    after = [on_worker(a, _worker_models) for a in dist.policy.group.actors]
    assert len(before) == len(after) == 2
    for rank, (b, a) in enumerate(zip(before, after)):
        assert b["ref_fp8"] == 0 and b["policy_fp8"] == 28, rank
        assert b["frozen"] and a["frozen"] and b["dtypes"] == {torch.float32}, rank
        assert sorted(a["params"]) == sorted(n for n, _ in loaded.named_parameters())
        for name, p in a["params"].items():
            assert torch.equal(b["params"][name], loaded.get_parameter(name)), f"rank {rank} {name}: not loaded"
            assert torch.equal(p, b["params"][name]), f"rank {rank} {name}: the reference moved during training"
    # the Ray reference logprobs are the single-process reference's (same rollout tokens, same logprob chunks)
    assert len(calls) == len(local_calls) == 2
    for step, (mine, theirs) in enumerate(zip(calls, local_calls)):
        assert torch.equal(mine.input_ids, theirs.input_ids), step
        m = mine.response_mask.bool()
        diff = float((mine.reference_logprobs - theirs.reference_logprobs).abs()[m].max())
        assert diff <= 1e-6, (step, diff)
    # the step-1 batch scored again after two updates: the same reference logprobs, bit for bit ...
    again = dist.policy.get_reference_policy_logprobs(calls[0])
    assert torch.equal(again, calls[0].reference_logprobs)
    # ... while the policy moved away from them
    m = calls[0].response_mask.bool()
    moved = float((dist.policy.get_logprobs(calls[0]) - again).abs()[m].max())
    assert moved > 0.05, moved


def test_ray_kl_and_loss_equal_the_single_process_run(runs, ray_cluster):
    (_, _, local_metrics), (_, _, dist_metrics), _ = runs
    for step, (want, got) in enumerate(zip(local_metrics, dist_metrics)):
        assert want["kl_penalty"] > 1e-4, "no KL to check: the policy equals the reference"
        assert got["kl_penalty"] == pytest.approx(want["kl_penalty"], rel=1e-5, abs=1e-7), step
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7), step
        for key, value in want.items():
            if key.endswith("_s"):
                continue
            if key in EXACT:
                assert got[key] == value, (step, key)
            else:
                assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
    assert dist_metrics[1]["kl_penalty"] > 2 * dist_metrics[0]["kl_penalty"]  # the update moved the policy
