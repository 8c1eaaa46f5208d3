"""The benchmarks use nemo_jetrl's public API only, and import each other as a package (`python -m benchmarks.x`).

Read from the syntax trees: no `from nemo_jetrl... import _name`, no private module (`nemo_jetrl._lazy`), no
`obj._name` attribute (on `self` / `cls` of the benchmarks' own classes, and on modules imported from other
packages such as `torch._scaled_mm`, it is allowed) and no `getattr(obj, "_name")`; no `sys.path` edits.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"

# Private names of other libraries the benchmarks reach on purpose (receiver is not an imported module name).
ALLOWED = {
    ("common.py", "cfg._attn_implementation"),  # transformers' config: the attention implementation switch
}


def _third_party_names(tree: ast.Module) -> set[str]:
    """Names bound by imports of packages other than nemo_jetrl and benchmarks (torch, transformers, ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if not _ours(a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not _ours(node.module or ""):
            names.update(a.asname or a.name for a in node.names)
    return names


def _ours(module: str) -> bool:
    return module.split(".")[0] in ("nemo_jetrl", "benchmarks")


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_uses(source: str, filename: str = "x.py") -> list[str]:
    """Every place `source` touches a private name of nemo_jetrl (or one that is not known to be someone else's)."""
    tree = ast.parse(source)
    others = _third_party_names(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and _ours(node.module or ""):
            if any(part.startswith("_") for part in (node.module or "").split(".")):
                found.append(f"{where}: private module {node.module}")
            found += [f"{where}: private name {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [f"{where}: private module {a.name}" for a in node.names if _ours(a.name) and "._" in a.name]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            text = ast.unparse(node)
            if _root(node) not in ("self", "cls", *others) and (filename, text) not in ALLOWED:
                found.append(f"{where}: private attribute {text}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("_"):
                    found.append(f"{where}: {node.func.id}(..., {name.value!r})")
        elif isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.path":
            found.append(f"{where}: sys.path edited (run as `python -m benchmarks.<name>`)")
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def test_the_benchmarks_touch_no_private_name():
    files = sorted(BENCHMARKS.glob("*.py"))
    assert len(files) >= 25 and (BENCHMARKS / "__init__.py").is_file()
    found = [use for f in files for use in private_uses(f.read_text(), f.name)]
    assert found == [], "\n".join(found)


def test_the_scan_sees_each_kind_of_private_use():
    source = """
import sys
import torch
from nemo_jetrl._lazy import lazy_exports
from nemo_jetrl.precision.gemm import _emulated_mm, fp8_blockwise_mm
cache = engine._new_cache(1, 8)
held = getattr(layer, "_qweight", None)
sys.path.insert(0, "benchmarks")
torch.cuda._sleep(1)
class Sampler:
    def stop(self):
        self._proc = None
"""
    found = private_uses(source)
    assert [line.split(": ", 1)[1] for line in found] == [
        "private module nemo_jetrl._lazy",
        "private name nemo_jetrl.precision.gemm._emulated_mm",
        "private attribute engine._new_cache",
        "getattr(..., '_qweight')",
        "sys.path edited (run as `python -m benchmarks.<name>`)",
    ]
