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


def pytest_collection_modifyitems(config, items):
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
