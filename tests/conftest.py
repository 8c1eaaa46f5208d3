"""Shared test setup: offline hubs, `jetrl_testkit` importable, deterministic threads, a `cuda` skip marker,
Triton-interpreter child runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # read when torch loads OpenMP, so before `import torch`
    # 2 xdist workers x the configs' 2 torch threads on the 2-core CI machine: waiting OpenMP threads must sleep, not
    # spin on a core the other worker needs (measured: the FP8 KV GRPO pair of tests 57 s instead of 75 s)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # `from jetrl_testkit import ...` (shared helpers)

import pytest  # noqa: E402
import torch  # noqa: E402

# The slowest CPU modules (seconds each in a full 2-worker run on the 2-core CI machine, 2026-11-26), started
# first: pytest-xdist's loadfile hands out whole modules in collection order (`--no-loadscope-reorder` in pyproject;
# its default order is by test count, which put the few-test slow modules last and left one worker running them
# alone at the end). The modules that start Ray take turns (`ray_lock`), so each is placed behind enough other work
# for the other worker that it rarely waits for the lock. Modules not listed follow in collection order; a stale
# entry only costs time.
SLOW_MODULES_FIRST = [
    "functional/test_ray_workers.py",  # 135-165 (Ray)
    "unit/distributed/test_tensor_parallel_gloo.py",  # 70
    "functional/test_random_checkpoint.py",  # 50
    "functional/test_reward_rises.py",  # 45: ~165 s on the other worker until the next Ray module
    "functional/test_ray_kl_resume.py",  # 45 (Ray)
    "functional/test_resume.py",  # 33
    "unit/models/test_fused_train_kernels.py",  # 33
    "functional/test_ray_tensor_parallel.py",  # 32 (Ray)
    "unit/models/test_fused_rollout_kernels.py",  # 31
    "unit/distributed/test_fsdp_gloo.py",  # 28
    "functional/test_kv_budget_grpo.py",  # 27
    "functional/test_vllm_backend.py",  # 23
    "slurm/test_ray_sub.py",  # 9 (Ray)
    "functional/test_grpo_tiny.py",  # 35
    "unit/generation/test_paged_exact.py",  # 27
    "unit/generation/test_sampler.py",  # 20
    "unit/benchmarks/test_bench_mismatch.py",  # 20
    "unit/config/test_schema.py",  # 18
    "unit/models/test_batch_invariant_attention.py",  # 18
    "unit/benchmarks/test_bench_dynamic_batching.py",  # 18
    "unit/generation/test_fp8_kv_attention.py",  # 18
    "unit/precision/test_batch_invariant_gemm.py",  # 17
    "unit/generation/test_continuous_batching.py",  # 17
    "functional/test_accuracy_study.py",  # 15
    "functional/test_kv_calibration.py",  # 15
    "functional/test_hardening.py",  # 14
    "unit/config/test_nemo_rl_compat.py",  # 14
    "functional/test_run_eval.py",  # 13
    "unit/distributed/test_import_hygiene.py",  # 12
    "unit/benchmarks/test_bench_protocol.py",  # 12
    "unit/benchmarks/test_bench_rollout_queue.py",  # 12
    "functional/test_grpo_nemo_rl_semantics.py",  # 10
]


def _module_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
    return SLOW_MODULES_FIRST.index(path) if path in SLOW_MODULES_FIRST else len(SLOW_MODULES_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_module_rank)  # stable: a module's tests stay together and in their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ray_lock(tmp_path_factory):
    """Held for a whole module that starts Ray (or a Slurm job that does): under pytest-xdist the other worker's
    Ray module waits (a lock file in the session's shared temp root), so two Rays never share the 2 CPUs."""
    from filelock import FileLock

    with FileLock(tmp_path_factory.getbasetemp().parent / "ray_module.lock"):
        yield


@pytest.fixture(scope="session")
def run_interpreted():
    """`run(source)`: runs Python `source` in a child process under Triton's interpreter (TRITON_INTERPRET is read
    when kernels are defined, so not in this process) and returns the JSON value its last stdout line holds."""

    def run(source: str, timeout: int = 600):
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run
