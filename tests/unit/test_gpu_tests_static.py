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


def _local_imports(tree: ast.Module) -> list[tuple[ast.FunctionDef, ast.AST]]:
    """(function, import node) for every import inside a function body (module-level ones run at collection)."""
    found = []
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef):
            found += [(func, node) for node in ast.walk(func) if isinstance(node, ast.Import | ast.ImportFrom)]
    return found


def _aliases(nodes: list[ast.AST]) -> dict[str, str]:
    """name -> dotted path of ours, for module-level imports (collection already checked that they resolve)."""
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
    out = [p for f in tree.body if isinstance(f, ast.FunctionDef) for p in _patch_problems(path, f, top)]
    for func, node in _local_imports(tree):
        aliases: dict[str, str] = dict(top)
        if isinstance(node, ast.ImportFrom) and node.module and _ours(node.module):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(mod, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        out.append(f"{path.name}:{node.lineno} {func.name}: {node.module} has no {alias.name}")
                        continue
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    importlib.import_module(alias.name)
                    aliases[alias.asname or alias.name] = alias.name
        out += _patch_problems(path, func, aliases) if len(aliases) > len(top) else []
    return sorted(set(out))


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
