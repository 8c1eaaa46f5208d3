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

# The modules that start Ray (or a Slurm job that does): under pytest-xdist they form one work unit (see
# `pytest_xdist_make_scheduler`), so one worker runs them back to back and two Rays never share the 2 CPUs, without
# a worker idling on `ray_lock` (which stays, for other ways of running the tests).
RAY_MODULES = [
    "functional/test_ray_workers.py",  # 150-170
    "functional/test_ray_kl_resume.py",  # 90
    "functional/test_ray_tensor_parallel.py",  # 55
    "slurm/test_ray_sub.py",  # 80 where CI's single-node Slurm runs, else a skip
    "slurm/test_torchrun_sub.py",  # 9 (the shim job); + ~40 where CI's Slurm runs (not measured: no Slurm here)
]
# The slowest CPU modules (seconds each in a full 2-worker run on the 2-core CI machine, 2026-11-27), started
# first, longest first: pytest-xdist's loadfile hands out whole modules in collection order (`--no-loadscope-reorder`
# in pyproject; its default order is by test count, which put the few-test slow modules last and left one worker
# running them alone at the end). The Ray unit (~400 s) goes first; the other worker works down this list meanwhile.
# Modules not listed follow in collection order; a stale entry only costs time.
SLOW_MODULES_FIRST = [
    *RAY_MODULES,
    "functional/test_torchrun_matrix.py",  # 50 (measured alone on the 2-core machine, 2026-11-28)
    "functional/test_random_checkpoint.py",  # 52
    "functional/test_resume.py",  # 47
    "functional/test_reward_rises.py",  # 45
    "unit/models/test_batch_invariant_attention.py",  # ~45 (+ the chunked decode in the interpreter, est.)
    "unit/models/test_fused_train_kernels.py",  # 36
    "unit/distributed/test_tensor_parallel_gloo.py",  # 38
    "functional/test_grpo_tiny.py",  # 30
    "functional/test_kv_budget_grpo.py",  # 30
    "unit/models/test_fused_rollout_kernels.py",  # 28
    "unit/generation/test_paged_exact.py",  # 27
    "functional/test_vllm_backend.py",  # 25
    "unit/benchmarks/test_bench_dynamic_batching.py",  # 24
    "unit/distributed/test_fsdp_gloo.py",  # 20
    "functional/test_kv_calibration.py",  # 20
    "unit/algorithms/test_kv_bootstrap.py",  # 18 (issue 43, est.)
    "unit/distributed/test_fsdp_checkpointing_gloo.py",  # 17 (issue 43, est.)
    "unit/algorithms/test_memory_preflight.py",  # 15 (issue 43, est.: a fresh CLI interpreter)
    "unit/models/test_activation_checkpointing.py",  # 12 (issue 43, est.)
    "functional/test_grpo_tiny_moe.py",  # 14 (issue 47: two 3-step tiny MoE runs through run_grpo.py)
    "unit/precision/test_grouped_gemm.py",  # 10 (issue 47: a Triton-interpreter child)
    "unit/benchmarks/test_bench_mismatch.py",  # 17
    "functional/test_hardening.py",  # 16
    "functional/test_nothing_lost.py",  # 14 (measured alone on the 2-core machine, 2026-11-28)
    "unit/generation/test_continuous_batching.py",  # 15
    "unit/benchmarks/test_bench_protocol.py",  # 13
    "functional/test_run_eval.py",  # 13
    "unit/precision/test_batch_invariant_gemm.py",  # 12
    "functional/test_accuracy_study.py",  # 12
    "functional/test_accuracy_long_study.py",  # 10 (issue 48: SFT 2 steps + eight 1-step arms in-process, 2 preflights)
    "functional/test_resume_position.py",  # 12
    "unit/config/test_schema.py",  # 11
    "functional/test_megatron_fp8_cpu_run.py",  # 11
    "functional/test_grpo_nemo_rl_semantics.py",  # 11
    "unit/benchmarks/test_bench_rollout_queue.py",  # 10
    "unit/distributed/test_import_hygiene.py",  # 9
    "functional/test_accuracy_stage_report.py",  # 6 (issue 48: stand-in processes stopped at a 4 s deadline)
    "unit/algorithms/test_grpo_wiring.py",  # 9
    "unit/utils/test_cpu_runtime.py",  # 9
]


def _module_path(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].removeprefix("tests/")


def _module_rank(item: pytest.Item) -> int:
    path = _module_path(item.nodeid)
    return SLOW_MODULES_FIRST.index(path) if path in SLOW_MODULES_FIRST else len(SLOW_MODULES_FIRST)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: no error where xdist is off (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the RAY_MODULES as one work unit (one worker runs them, in their order)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayUnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "ray modules" if _module_path(nodeid) in RAY_MODULES else super()._split_scope(nodeid)

    return RayUnitScheduling(config, log)


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
    """Held for a whole module that starts Ray (or a Slurm job that does): where two pytest processes could run two
    such modules at once (the RAY_MODULES unit above keeps them on one xdist worker), the second waits (a lock file in
    the session's shared temp root), so two Rays never share the 2 CPUs."""
    from filelock import FileLock

    with FileLock(tmp_path_factory.getbasetemp().parent / "ray_module.lock"):
        yield


@pytest.fixture(scope="session")
def run_interpreted():
    """`run(source)`: runs Python `source` in a child process under Triton's interpreter (TRITON_INTERPRET is read
    when kernels are defined, so not in this process) and returns the JSON value its last stdout line holds. The
    children fork from one server per pytest process that imported torch, triton and nemo_jetrl once
    (jetrl_testkit/interp_server.py); each still runs `source` as `python -c source` in a process of its own."""
    server: subprocess.Popen | None = None

    def run(source: str, timeout: int = 600):
        nonlocal server
        if server is None:
            env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
            command = [sys.executable, str(Path(__file__).parent / "jetrl_testkit" / "interp_server.py")]
            server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            assert server.stdout.readline().strip() == "ready", "the interpreter fork server did not start"
        server.stdin.write(json.dumps({"source": source, "timeout": timeout}) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        assert line, f"the interpreter fork server exited ({server.poll()})"
        reply = json.loads(line)
        assert reply["rc"] == 0, reply["stderr"][-3000:]
        return json.loads(reply["stdout"].strip().splitlines()[-1])

    yield run
    if server is not None:
        server.stdin.close()
        server.wait(timeout=60)
