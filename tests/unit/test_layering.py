"""Layers that only point down: every import between nemo_jetrl's subpackages runs down the floor order below, the
Triton kernels import no dispatcher, and no modules import each other in a circle (tools/import_graph.py reads the
graph from the syntax trees; docs/architecture.md shows the floors).

The allow-lists name each exception with the reason it stays or the change that removes it; a test below fails once
an entry is no longer needed, so the lists only shrink.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jetrl_testkit.cli import load_script

ROOT = Path(__file__).resolve().parents[2]
graph_tool = load_script(ROOT / "tools" / "import_graph.py", "import_graph_tool")

# Bottom to top. A module may import its own subpackage and any floor below its own.
FLOORS = (
    "_lazy",  # the lazy-export helper of the package __init__s
    "config",  # loader, overrides, section base types, errors, the NeMo-RL key table (data)
    "utils",  # run bookkeeping: logger, timers, checksummed checkpoint files, locks, plots
    "precision",  # recipes, quantizers, GEMMs, FP8 linears, Triton kernels
    "data",  # readers, prompt templates, the dataset task
    "environments",  # verifiable tasks and rewards
    "models",  # the one forward, scoring, fused kernels, loading / export
    "generation",  # rollout engines (native, vLLM adapter), seed shards
    "policy",  # the trainer, with its parallel plans (policy/parallel/: FSDP2, tensor parallel, the FP8 gather)
    "distributed",  # torchrun / Ray placement around policy and generation, the batch split
    "algorithms",  # the GRPO loop, losses, advantages
    "evals",  # evaluation of checkpoints
    "schema",  # the composed config (every section) + NeMo-RL translation
    "nemo_jetrl",  # the package __init__
)

# (importing module, imported module) -> why it still runs up, and the change that removes it.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}

# Import circles among modules (runtime and type-only imports), each with the change that removes it.
CIRCLES_ALLOWED = {
    frozenset(
        {
            "nemo_jetrl.precision.quantized",
            "nemo_jetrl.precision.recipe",
            "nemo_jetrl.precision.recipes",
            "nemo_jetrl.precision.recipes.axis",
            "nemo_jetrl.precision.recipes.base",
            "nemo_jetrl.precision.recipes.blockwise",
            "nemo_jetrl.precision.recipes.gemm_choice",
        }
    ): (
        "type only: a ScaleLayout's methods name the QuantizedWeight and PrecisionRecipe that hold it (under "
        "TYPE_CHECKING); no module imports another back at run time. Kept: typing them against Protocols would add "
        "types without removing a dependency"
    ),
}

KERNELS = "nemo_jetrl.precision.kernels"
KERNEL_MAY_IMPORT = (KERNELS + ".", "nemo_jetrl.precision.e4m3")  # never a dispatcher (gemm, quant, ...)


def floor_of(module: str) -> int:
    return FLOORS.index(graph_tool.subpackage(module))


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (importer, imported) pair whose imported module sits on a higher floor."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if floor_of(b) > floor_of(a))


@pytest.fixture(scope="module")
def graph():
    return graph_tool.module_graph(ROOT, typing=True)


def test_every_subpackage_has_a_floor(graph):
    subpackages = {graph_tool.subpackage(m) for m in graph}
    assert subpackages <= set(FLOORS), sorted(subpackages - set(FLOORS))
    assert len(graph) > 150  # the walk found the package


def test_imports_point_down_the_floors(graph):
    found = [f"{a} -> {b}" for a, b in upward_arrows(graph) if (a, b) not in UPWARD_ALLOWED]
    assert found == [], "imports that run up the floors (FLOORS in this file):\n" + "\n".join(found)


def test_kernels_import_no_dispatcher(graph):
    found = [
        f"{a} -> {b}"
        for a, targets in graph.items()
        if a.startswith(KERNELS + ".")
        for b in sorted(targets)
        if not b.startswith(KERNEL_MAY_IMPORT)
    ]
    assert found == []


def test_no_import_circles(graph):
    found = [sorted(c) for c in graph_tool.circles(graph) if frozenset(c) not in CIRCLES_ALLOWED]
    assert found == []


def test_the_allow_lists_hold_only_what_is_still_there(graph):
    """An entry whose arrow or circle is gone must go too (the lists only shrink)."""
    arrows = set(upward_arrows(graph))
    assert [pair for pair in UPWARD_ALLOWED if pair not in arrows] == []
    circles = {frozenset(c) for c in graph_tool.circles(graph)}
    assert [sorted(c) for c in CIRCLES_ALLOWED if c not in circles] == []


def test_the_checks_see_an_arrow_up_and_a_circle():
    fake = {
        "nemo_jetrl.precision.quant": {"nemo_jetrl.policy.native"},  # precision -> policy: up
        "nemo_jetrl.policy.native": {"nemo_jetrl.precision.quant"},
    }
    assert upward_arrows(fake) == [("nemo_jetrl.precision.quant", "nemo_jetrl.policy.native")]
    assert graph_tool.circles(fake) == [["nemo_jetrl.policy.native", "nemo_jetrl.precision.quant"]]
