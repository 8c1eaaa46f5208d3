"""The package's import graph, read from the syntax trees (nothing imported): module -> module arrows, the
arrows between subpackages, and the import circles among modules.

    uv run python tools/import_graph.py            # subpackage arrows, upward arrows, circles
    uv run python tools/import_graph.py --modules  # every module -> module arrow too

Every `import` counts, at module level or inside a function (a deferred import still ties the two modules); those
under `if TYPE_CHECKING:` count for the layer order (a type is a dependency too) but not for the circles (they never
run). tests/unit/test_layering.py holds the layer order and the circles against this graph.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "nemo_jetrl"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Line numbers of the imports under `if TYPE_CHECKING:` (typing only: no runtime arrow)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for inner in ast.walk(sub):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        lines.add(inner.lineno)
    return lines


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest prefix of dotted `name` that is one of `modules` (a `from pkg import mod` names a module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def module_graph(root: Path = ROOT, typing: bool = False) -> dict[str, set[str]]:
    """module -> the package modules it imports (its own package `__init__`s not counted); with `typing`, the imports
    under `if TYPE_CHECKING:` too."""
    files = {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = set() if typing else _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                targets.update(_resolve(a.name, modules) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    targets.add(_resolve(f"{base}.{a.name}", modules) or _resolve(base, modules))
        targets.discard(None)
        # a package's own __init__ chain is imported by anything below it: not an arrow of the module's choice
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
        graph[name] = {t for t in targets if t != name and t not in ancestors}
    return graph


def subpackage(module: str) -> str:
    """`nemo_jetrl.precision.kernels.triton_gemm` -> `precision`; top-level modules -> their own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def package_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(from subpackage, to subpackage) -> the module arrows behind it."""
    arrows = defaultdict(list)
    for src, targets in graph.items():
        for dst in sorted(targets):
            a, b = subpackage(src), subpackage(dst)
            if a != b:
                arrows[(a, b)].append((src, dst))
    return dict(sorted(arrows.items()))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; sorted by first module."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _short(module: str) -> str:
    return module.partition(".")[2] or module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", action="store_true", help="print every module -> module arrow too")
    p.add_argument("--typing", action="store_true", help="count the imports under `if TYPE_CHECKING:` too")
    args = p.parse_args(argv)
    graph = module_graph(typing=args.typing)
    if args.modules:
        for src in sorted(graph):
            for dst in sorted(graph[src]):
                print(f"{src} -> {dst}")
        print()
    arrows = package_arrows(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} module arrows, {len(arrows)} subpackage arrows:")
    for (a, b), behind in arrows.items():
        shown = ", ".join(f"{_short(s)}->{_short(d)}" for s, d in behind[:4])
        print(f"  {a} -> {b}  ({len(behind)}: {shown}{' ...' if len(behind) > 4 else ''})")
    found = circles(module_graph())  # runtime imports only
    print(f"{len(found)} import circles among modules:")
    for c in found:
        print("  " + " <-> ".join(map(_short, c)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
