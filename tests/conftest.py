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
