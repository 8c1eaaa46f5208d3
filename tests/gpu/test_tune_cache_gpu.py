"""GPU check of the shared kernel picks (precision/kernels/tune_cache.py): processes started together with one picks
file run the fast path's decode-sized FP8 products with one configuration each, so their outputs are the same bits;
with the file off, each times for itself (printed: whether the picks then differ, issue 48's question of why the FP8
rollout scored one start differently in processes sharing a GPU).

Run: `python3 -m pytest -q -s tests/gpu/test_tune_cache_gpu.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
SHAPES = ((64, 4096, 4096), (64, 12288, 4096), (128, 4096, 12288), (16, 2048, 6144))  # (M, N, K) decode-sized
CHILD = """
import hashlib, json, sys, torch
from nemo_jetrl.precision import act_quant, fp8_blockwise_mm, weight_quant
from nemo_jetrl.precision.kernels import tune_cache
out = {}
for m, n, k in json.loads(sys.argv[1]):
    gen = torch.Generator(device="cuda").manual_seed(m * n + k)
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    y = fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16)  # "auto": the timed pick at these sizes
    out[f"{m}x{n}x{k}"] = hashlib.sha256(y.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
print(json.dumps({"outputs": out, "picks": tune_cache.used_picks()}))
"""


def _run_together(count: int, cache: str) -> list[dict]:
    env = {**os.environ, "NEMO_JETRL_TUNE_CACHE": cache, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(SHAPES)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(count)]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_processes_sharing_the_picks_file_take_one_pick_and_give_one_output(tmp_path):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the timed split-K decode GEMM runs on sm90")
    cache = tmp_path / "picks.json"
    shared = _run_together(3, str(cache))
    stored = json.loads(cache.read_text())
    assert len(stored) == len(SHAPES)  # one key a shape, timed once for the three processes
    assert all(r["picks"] == stored for r in shared)
    assert all(r["outputs"] == shared[0]["outputs"] for r in shared)
    alone = _run_together(3, "off")  # each process times for itself, as before the shared file
    differ = [shape for shape in SHAPES if len({json.dumps(r["outputs"][f"{shape[0]}x{shape[1]}x{shape[2]}"])
                                               for r in alone}) > 1]  # fmt: skip
    picks = [sorted(str(v) for v in r["picks"].values()) for r in alone]
    print(
        f"\nshared file: picks {sorted(str(v) for v in stored.values())}; timed apart: picks {picks}; "
        f"shapes whose outputs differ between processes timed apart: {differ or 'none'}"
    )


def test_timing_a_cublas_product_in_graphs_leaves_no_workspace_behind():
    """The tuner times the library GEMM (cuBLAS `scaled_mm`) inside CUDA graphs after an eager warm-up on a side
    stream. cuBLAS keeps a workspace per (handle, stream), counted as allocated, for the life of the process: with a
    new pool stream per timing each one left a workspace behind (an FP8 process that tuned held 165 MiB more than one
    that read its picks, docs/long_responses.md). With one side stream per GPU only the first timing allocates."""
    from nemo_jetrl.precision.kernels.device import time_in_graph

    x = torch.randn(64, 4096, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(4096, 4096, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")

    def product():
        return torch._scaled_mm(x, w.t(), one, one, out_dtype=torch.bfloat16)

    time_in_graph([product])  # the first timing: the side stream's and the capture stream's workspaces
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(4):
        time_in_graph([product])
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
