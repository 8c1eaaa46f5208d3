"""Ray worker group on CPU: 2 workers x gloo (FSDP2 + FP8 refit) vs one process, and failure handling.

Each worker holds the trainer of its rank (`NativePolicy` on the "fsdp" plan) as a torchrun rank does
(tests/functional/test_torchrun_matrix.py runs the same features on torchrun ranks). Tolerance of the equality test:
the rollout (tokens, rewards, lengths) and the largest FP8 KV scale are bitwise equal; training metrics agree to 1e-5
relative (bitwise with one micro-batch per worker, `fixed`; with several, the gradient is reduce-scattered after
each micro-batch, so it sums them in another order, and Adam turns a small gradient's last bits into a move of up to
lr: the step-2 weights and the KV scales calibrated from them agree to the bounds stated at the asserts). The single-process run uses `cluster.rollout_seed_shards=2`,
the Ray run's shard count. The tiny config runs the `jetrl_kv` recipe: FP8 KV cache with per-step QKV calibration;
`fixed` also takes prev_logprobs from the training forward and runs matched kernels, `dynamic` calibrates the KV
scales after the update (post_step), `packed` runs matched kernels over packed rows (the batch-invariant varlen
attention). `matched_kernels: auto` is the workers' joint self-check.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest
import torch
from jetrl_testkit.runs import metrics as _metrics

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray is imported (DESIGN.md §5)
ray = pytest.importorskip("ray", reason="the `ray` extra is not installed (uv sync --extra ray)")

from nemo_jetrl.algorithms.grpo import grpo_step, run_grpo, setup  # noqa: E402
from nemo_jetrl.config import load_config  # noqa: E402
from nemo_jetrl.distributed import ClusterSpec, WorkerGroupError  # noqa: E402
from nemo_jetrl.distributed.cluster_config import ClusterConfig  # noqa: E402
from nemo_jetrl.distributed.worker_group import RayWorkerGroup  # noqa: E402
from nemo_jetrl.policy.interfaces import TrainBatch  # noqa: E402
from nemo_jetrl.policy.native import NonFiniteError  # noqa: E402
from nemo_jetrl.schema import MasterConfig, validate_config  # noqa: E402
from nemo_jetrl.utils.checkpoint import CheckpointManager  # noqa: E402
from nemo_jetrl.utils.progress import RunProgress  # noqa: E402
from nemo_jetrl.utils.timers import Timer  # noqa: E402

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_tiny.yaml"
EXACT = ("reward_mean", "accuracy", "mean_response_length", "truncated_fraction", "kept_fraction")


def _cfg(tmp: Path, *extra: str) -> MasterConfig:
    overrides = [
        "grpo.max_num_steps=2",
        "grpo.num_prompts_per_step=16",
        "policy.train_micro_batch_size=64",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "cluster.num_cpu_threads=1",
        "cluster.rollout_seed_shards=2",
        "logger.tensorboard_enabled=false",
        f"logger.log_dir={tmp / 'logs'}",
        f"checkpointing.checkpoint_dir={tmp / 'ckpt'}",
        *extra,
    ]
    return validate_config(load_config(CONFIG, overrides))


FIXED = [  # prev_logprobs from the training forward (grpo_tiny's auto), the rollout's attention in the trainer
    "policy.generation.matched_kernels=true",
]
DYNAMIC = [  # length-sorted micro-batches of <= 200 / 300 tokens, each trimmed to its rows' columns
    "policy.prev_logprobs_source=logprob_forward",
    "policy.generation.kv_cache_calibration_pass=post_step",  # KV scales from a forward after the update
    "policy.dynamic_batching.enabled=true",
    "policy.dynamic_batching.train_mb_tokens=200",
    "policy.dynamic_batching.logprob_mb_tokens=300",
    "policy.dynamic_batching.sequence_length_round=4",
]


PACKED = [  # bins of <= 200 / 300 real tokens, each run as one packed row; matched kernels: the batch-invariant
    # varlen attention in the workers' trainers and rollouts as in the one process
    "policy.prev_logprobs_source=logprob_forward",
    "policy.generation.matched_kernels=true",
    "policy.sequence_packing.enabled=true",
    "policy.sequence_packing.train_mb_tokens=200",
    "policy.sequence_packing.logprob_mb_tokens=300",
    "policy.sequence_packing.sequence_length_round=4",
]


@pytest.mark.parametrize("batching", [FIXED, DYNAMIC, PACKED], ids=["fixed", "dynamic", "packed"])
def test_two_ray_workers_match_the_single_process_run(tmp_path, ray_cluster, batching):
    run_grpo(_cfg(tmp_path / "local", "checkpointing.enabled=true", "checkpointing.save_period=2", *batching))
    run_grpo(
        _cfg(
            tmp_path / "ray",
            "cluster.backend=ray",
            "cluster.cpu_workers_per_node=2",
            "checkpointing.enabled=true",
            "checkpointing.save_period=2",
            *batching,
        )
    )
    gc.collect()  # the run's worker group is released with it (frees the 2 CPUs for the next test)
    local, dist = _metrics(tmp_path / "local" / "logs"), _metrics(tmp_path / "ray" / "logs")
    assert sorted(local) == sorted(dist) == [1, 2]
    micro = local[1]["train/num_micro_batches"]
    assert (micro >= 4) if batching != FIXED else (micro <= 2)  # fixed: 64-row micro-batches; else 200-token ones
    for step in (1, 2):
        for key, value in local[step].items():
            if key.startswith("timing/") or key.endswith("_s") or key == "step":
                continue
            name = key.removeprefix("train/")
            if name in EXACT or batching is FIXED:  # one micro-batch per worker: every metric bitwise
                assert dist[step][key] == value, (step, key)
            else:  # step 2's KV scales are maxima over a forward of weights apart by the Adam moves below
                rel = 5e-3 if step == 2 and name.startswith("refit/kv_") else 1e-5  # 1.1e-3 measured (dynamic)
                assert dist[step][key] == pytest.approx(value, rel=rel, abs=1e-7), (step, key)
        assert dist[step]["train/refit/fp8_vs_bf16_bytes"] == pytest.approx(0.5 + 1 / 8192)
        assert dist[step]["train/refit/num_fp8_weights"] == 28
        assert dist[step]["train/refit/kv_k_scale_max"] == local[step]["train/refit/kv_k_scale_max"]  # FP8 KV
        exact = "train/exact_token_fraction"
        assert dist[step][exact] == local[step][exact], step  # the workers' trainers score as the one process
    # the Ray checkpoint has the single-process layout and (nearly) the same weights
    a = CheckpointManager(tmp_path / "local" / "ckpt").load_latest()
    b = CheckpointManager(tmp_path / "ray" / "ckpt").load_latest()
    assert a["step"] == b["step"] == 2
    assert a["policy"]["model"].keys() == b["policy"]["model"].keys()
    # One micro-batch per worker: bitwise. Otherwise the one process sums other micro-batches than each worker, and
    # Adam's first steps move an element by about lr whatever its gradient's size, so where a small gradient's last
    # bits differ the two runs may move it apart: at most 2 steps x 2 x lr (3e-4 measured with packing, lr 2e-4)
    lr = local[1]["train/lr"]
    atol = 0.0 if batching is FIXED else 2 * 2 * lr
    for name, value in a["policy"]["model"].items():
        torch.testing.assert_close(b["policy"]["model"][name], value, rtol=0, atol=atol, msg=name)


def test_ray_workers_run_the_matched_kernels_self_check_together(tmp_path, ray_cluster, capsys):
    """`matched_kernels: auto` on Ray: both workers run the start-up self-check on their own device, the ranks take
    one verdict, and the driver prints rank 0's line: the one process's verdict with the ranks named (on a CPU the
    float32 GEMMs are not row-invariant, so both say off)."""
    auto = "policy.generation.matched_kernels=auto"
    local = setup(_cfg(tmp_path / "local", auto))
    local_lines = [line for line in capsys.readouterr().out.splitlines() if "matched_kernels: auto" in line]
    del local
    run = setup(_cfg(tmp_path / "ray", auto, "cluster.backend=ray"))
    ray_lines = [line for line in capsys.readouterr().out.splitlines() if "matched_kernels: auto" in line]
    run.policy.group.shutdown()
    head = "policy.generation.matched_kernels: auto -> off: not row-invariant on cpu"
    assert len(local_lines) == 1 and local_lines[0].startswith(f"{head}: "), local_lines
    problem = local_lines[0].removeprefix(f"{head}: ").removesuffix(" (true forces it)")
    assert ray_lines == [f"{head} (2 ranks): {problem} (rank 0) (true forces it)"]


def test_a_worker_raising_inside_a_collective_is_one_error_and_the_checkpoint_survives(tmp_path, ray_cluster):
    kv_off = ("policy.generation.kv_cache_dtype=auto", "policy.fp8_cfg.train_kv_fake_quant=false")
    cfg = _cfg(tmp_path, "cluster.backend=ray", "checkpointing.enabled=true", *kv_off)
    run = setup(cfg)
    with RunProgress(2) as progress:
        grpo_step(run, 0, Timer(), progress)
    run.checkpoints.save(1, {"policy": run.policy.state_dict(), "step": 1})
    group = run.policy.group
    # a non-finite gradient is not a worker failure: every rank skips the optimizer step, the driver decides
    batch = run.engine.generate([[1, 5, 5, 13]] * 4, generator=torch.Generator().manual_seed(0))
    nan_batch = TrainBatch(
        batch.input_ids,
        batch.attention_mask,
        batch.response_mask,
        torch.full((4,), float("nan")),
        batch.generation_logprobs,
    )
    nan_batch.prev_logprobs = nan_batch.generation_logprobs
    with pytest.raises(NonFiniteError, match=r"non-finite (loss|gradient)"):
        run.policy.train(nan_batch, run.loss_fn)
    assert run.policy.step == 1 and len(group.actors) == 2
    # worker 1 gets a malformed micro-batch: it raises after the forward's all-gathers, while worker 0 goes on
    # into the backward's reduce-scatter and would wait forever for it.
    good = TrainBatch(
        batch.input_ids, batch.attention_mask, batch.response_mask, torch.ones(4), batch.generation_logprobs
    )
    good.prev_logprobs = good.generation_logprobs
    bad = good.select(slice(0, 4))
    bad.advantages = torch.ones(3)
    with pytest.raises(WorkerGroupError) as info:
        group.run("train", "train", per_worker=[([good], run.loss_fn), ([bad], run.loss_fn)])
    err = info.value
    assert (err.worker, err.phase) == (1, "train") and "IndexError" in err.cause  # advantages [3] for 4 rows
    assert str(err).startswith("worker 1 (node ") and "failed during phase 'train'" in str(err)
    assert group.actors == []
    for _ in range(100):  # every worker stopped: their CPUs come back (resource views update asynchronously)
        if ray.available_resources().get("CPU") == 2:
            break
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == 2
    with pytest.raises(RuntimeError, match="worker group is shut down"):
        group.run("refit", "refit")
    state = CheckpointManager(tmp_path / "ckpt").load_latest()
    assert state["step"] == 1 and "model.embed_tokens.weight" in state["policy"]["model"]


def test_a_dead_worker_is_named_with_its_phase(ray_cluster):
    group = RayWorkerGroup(
        ClusterSpec.from_config(ClusterConfig(backend="ray", cpu_workers_per_node=2, num_cpu_threads=1))
    )
    ray.kill(group.actors[1], no_restart=True)
    for _ in range(100):  # ray.kill is asynchronous: wait until the actor is really gone
        try:
            ray.get(group.actors[1].info.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.1)
    with pytest.raises(
        WorkerGroupError, match=r"worker 1 \(node .*\) failed during phase 'ping': the worker process died"
    ):
        group.run("ping", "info")
    assert group.actors == []


def test_workers_run_with_the_trainers_environment(ray_cluster):
    """policy.dtensor_cfg.env_vars reach every worker's process before it starts (Ray's runtime_env), as NeMo-RL's
    policy workers get them; a group without them leaves the environment alone."""
    spec = ClusterSpec.from_config(ClusterConfig(backend="ray", cpu_workers_per_node=2, num_cpu_threads=1))
    group = RayWorkerGroup(spec, env_vars={"JETRL_TRAINER_ENV": "7"})
    try:
        seen = ray.get([a.__ray_call__.remote(lambda _: os.environ.get("JETRL_TRAINER_ENV")) for a in group.actors])
    finally:
        group.shutdown()
    assert seen == ["7", "7"]
    plain = RayWorkerGroup(spec)
    try:
        assert ray.get(plain.actors[0].__ray_call__.remote(lambda _: os.environ.get("JETRL_TRAINER_ENV"))) is None
    finally:
        plain.shutdown()
