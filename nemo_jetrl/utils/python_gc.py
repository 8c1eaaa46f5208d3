"""Python's cyclic garbage collector during a run: what start-up built is frozen out of its scans.

A full collection walks every tracked object; after the imports (torch, transformers, sympy), the model and the
data a GRPO process holds a few hundred thousand, so each full pass costs ~0.1 s of host time, and the CUDA-graph
captures start with one (`generation.native.cuda_graph.collector_paused`), once per rollout. `gc.freeze()` after
start-up (as vLLM does after its set-up) moves those objects into a permanent generation that no collection scans:
garbage the steps make is still collected, start-up's is collected once before the freeze.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[int]:
    """Collect, freeze every object alive now for the block (yields how many), unfreeze on exit."""
    gc.collect()
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()
