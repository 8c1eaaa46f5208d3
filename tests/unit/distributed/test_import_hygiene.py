"""The torch-only pieces (and benchmarks/bench_fsdp_refit.py) import without Ray, OmegaConf or pydantic.

The GPU box that runs the FSDP benchmark has none of them; a stray import would only show up there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "omegaconf", "pydantic", "hydra"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, {root!r})
import nemo_jetrl.distributed, nemo_jetrl.distributed.dp_policy, nemo_jetrl.distributed.worker
import benchmarks.bench_fsdp_refit as bench
assert bench.parse_args(["--out", "x.json"]).model == "1.7b"
print("ok")
"""


def test_torch_only_modules_import_without_ray_omegaconf_pydantic():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK.format(root=str(ROOT))], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
