"""The GPU tests never run in CI (no GPU there), so names they import or patch inside their functions can rot
unseen when the package moves code: check them statically on the CPU.

Every `from M import a, b` / `import M [as X]` inside a function of tests/gpu/*.py must resolve to a module of this
repository (or an installed one) holding those names, and every `monkeypatch.setattr(X, "name", ...)` whose X is
such a module alias must name an attribute that exists (monkeypatch raises on a missing one, after the GPU time is
spent)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

GPU_TESTS = sorted((Path(__file__).parents[1] / "gpu").glob("test_*.py"))
PACKAGES = ("nemo_jetrl", "benchmarks")  # ours: a missing name there is a defect, not an optional dependency


def _aliases(nodes: list[ast.AST]) -> dict[str, str]:
    """name -> dotted path of ours, for the given import nodes."""
    out = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and _ours(node.module):
            out |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.asname or a.name: a.name for a in node.names if _ours(a.name)}
    return out


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def problems(path: Path) -> list[str]:
    """What in `path`'s functions imports or patches a name that does not exist."""
    tree = ast.parse(path.read_text())
    top = _aliases([n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)])
    out = []
    scopes = [*tree.body, *(m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body)]
    for func in (f for f in scopes if isinstance(f, ast.FunctionDef)):  # a nested function is inside its parent's
        local = [n for n in ast.walk(func) if isinstance(n, ast.Import | ast.ImportFrom)]
        out += [p for node in local for p in _missing_names(path, func, node)]
        out += _patch_problems(path, func, top | _aliases(local))
    return out


def _missing_names(path: Path, func: ast.FunctionDef, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The names an import inside `func` takes from our packages that do not exist (a module that does not is an
    ImportError here, as it would be on the GPU)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if _ours(alias.name):
                importlib.import_module(alias.name)
        return []
    if not (node.module and _ours(node.module)):
        return []
    mod, out = importlib.import_module(node.module), []
    for alias in node.names:
        if not hasattr(mod, alias.name):
            try:
                importlib.import_module(f"{node.module}.{alias.name}")
            except ImportError:
                out.append(f"{path.name}:{node.lineno} {func.name}: {node.module} has no {alias.name}")
    return out


def _patch_problems(path: Path, func: ast.FunctionDef, aliases: dict[str, str]) -> list[str]:
    out = []
    for call in ast.walk(func):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "setattr"):
            continue
        if len(call.args) < 2 or not isinstance(call.args[0], ast.Name) or call.args[0].id not in aliases:
            continue
        if not isinstance(call.args[1], ast.Constant):
            continue
        try:
            target = importlib.import_module(aliases[call.args[0].id])
        except ImportError:
            continue  # a function or class imported by name: its attributes are not a module's
        if not hasattr(target, call.args[1].value):
            out.append(f"{path.name}:{call.lineno} {func.name}: {target.__name__} has no {call.args[1].value!r}")
    return out


@pytest.mark.parametrize("path", GPU_TESTS, ids=lambda p: p.name)
def test_gpu_tests_import_and_patch_names_that_exist(path):
    assert problems(path) == []


def test_the_check_finds_a_stale_patch_and_a_stale_import(tmp_path):
    """A patch of a function that had moved to another module (seen on the GPU, 2026-11-28) and an import of a name
    that does not exist."""
    stale = tmp_path / "test_stale_gpu.py"
    stale.write_text(
        "def test_a(monkeypatch):\n"
        "    import nemo_jetrl.policy.native as native\n"
        "    monkeypatch.setattr(native, 'metrics_to_floats', None)\n"
        "def test_b():\n"
        "    from nemo_jetrl.precision.axis_gemm import aligned_16, no_such_name\n"
    )
    assert problems(stale) == [
        "test_stale_gpu.py:3 test_a: nemo_jetrl.policy.native has no 'metrics_to_floats'",
        "test_stale_gpu.py:5 test_b: nemo_jetrl.precision.axis_gemm has no no_such_name",
    ]


def test_a_module_level_alias_is_checked_too(tmp_path):
    stale = tmp_path / "test_top_gpu.py"
    stale.write_text(
        "from nemo_jetrl.policy import native\n"
        "def test_a(monkeypatch):\n"
        "    monkeypatch.setattr(native, 'metrics_to_floats', None)\n"
    )
    assert problems(stale) == ["test_top_gpu.py:3 test_a: nemo_jetrl.policy.native has no 'metrics_to_floats'"]


def test_the_gpu_suite_runner_lists_every_gpu_test_file_once():
    """benchmarks/gpu_suite.sh deals its FILES over the GPUs (+ the 2-GPU torchrun test): a new GPU test file not
    listed there would never run in the one-call suite (the script also refuses to start then, on the GPU)."""
    import re

    script = (Path(__file__).parents[2] / "benchmarks" / "gpu_suite.sh").read_text()
    listed = re.search(r"^FILES=\((.*?)\)", script, re.S | re.M).group(1).split() + ["test_torchrun_gpu"]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(p.stem for p in GPU_TESTS)


def test_the_gpu_wheels_tool_names_packages_uv_lock_pins():
    """tools/gpu_wheels.sh fetches its PACKAGES at uv.lock's versions: each must be pinned there (a renamed or
    dropped dependency would stop the tool, and with it the next GPU session's set-up)."""
    import re
    import tomllib

    root = Path(__file__).parents[2]
    script = (root / "tools" / "gpu_wheels.sh").read_text()
    names = re.search(r"PACKAGES=\(([^)]*)\)", script).group(1).split()
    pinned = {p["name"] for p in tomllib.loads((root / "uv.lock").read_text())["package"]}
    assert len(names) == 9 and "pydantic-core" in names and "hydra-core" in names
    assert [n for n in names if n not in pinned] == []
