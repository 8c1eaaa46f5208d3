"""The GPU-side modules (Ray workers, trainers, rollout, models, precision) import without Ray, OmegaConf or
pydantic, and the benchmarks without Ray or OmegaConf: the GPU box that runs the benchmarks has none of them but
the pydantic wheels carried for the config section types (docs/gpu_cli_run.md), and a stray import would only show
up there. The config section types (`*/config.py`, `distributed/cluster_config.py`) are the one exception.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

BLOCK = """
import importlib, pkgutil, sys
BLOCKED = {{"ray", "omegaconf", "pydantic", "hydra"}}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, {root!r})
import nemo_jetrl
names = [
    "nemo_jetrl.algorithms.loss",
    "nemo_jetrl.config.typed",
    "nemo_jetrl.distributed",
    "nemo_jetrl.distributed.cluster",
    "nemo_jetrl.policy.parallel.sharding",
    "nemo_jetrl.distributed.launch",
    "nemo_jetrl.distributed.worker",
    "nemo_jetrl.policy.native",
]
for package in ("generation", "models", "precision"):
    pkg = importlib.import_module("nemo_jetrl." + package)
    names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".") if not m.name.endswith(".config")]
for name in names:
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
BLOCKED.discard("pydantic")  # the benchmarks build their sections from the typed config (benchmarks/common.py)
benchmarks = ["benchmarks.common", "benchmarks.bench_train_step", "benchmarks.bench_grpo_step",
              "benchmarks.bench_rollout", "benchmarks.bench_fsdp_refit", "benchmarks.bench_mismatch"]
for name in benchmarks:
    importlib.import_module(name)
import benchmarks.bench_fsdp_refit as bench
assert bench.parse_args(["--out", "x.json"]).model == "1.7b"
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print(len(names), len(benchmarks), "ok")
"""


def test_gpu_side_modules_without_ray_omegaconf_pydantic_and_benchmarks_without_ray_omegaconf():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK.format(root=str(ROOT))], capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith(" ok"), proc.stderr[-2000:]
    modules, benchmarks = (int(n) for n in proc.stdout.split()[:2])
    assert modules > 30 and benchmarks == 6  # the package walks found the modules; every benchmark imported
