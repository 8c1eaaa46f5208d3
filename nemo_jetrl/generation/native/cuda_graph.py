"""One decode step captured in a CUDA graph (gpt-fast / vLLM style), replayed once per generated token.

`CapturedStep(fn, static_inputs)` runs `fn(*static_inputs)` once eagerly on a side stream (JIT compiles, cuBLAS
workspaces), captures it, and from then on each call copies the new inputs into the static buffers and replays the
graph: one launch per token instead of hundreds. `fn` must be idempotent for the same inputs (the warm-up and the
capture both run the real step: the KV cache write of the same token at the same position is repeated, harmless)
and must not sync with the host.

What the graph bakes in: every tensor address `fn` touches. Buffers updated in place between steps (the engine's
attention mask, the cache position scalar, the KV cache) are read fresh at each replay; the model's weights too,
as long as they change in place. The FP8 weight cache of an `Fp8Linear` is a new tensor after each optimizer step,
so a graph lives for one `generate()` call (the engine captures again per rollout: a few ms per layer).

Batch-size buckets (`BucketedSteps`): the continuous rollout's live rows change at every host sync, so the step
is captured once per bucket size it meets (8, 16, 32, ... up to the row count), all graphs in one memory pool, and
each window runs the smallest bucket that holds the live rows: the drain at the end of a queue replays small graphs.

The decode step a rollout runs (`rollout_decoder`): its prefix form (attention over the written prefix, eager), its
static form (the whole buffer, a 0-dim column tensor: fixed shapes) or that static form captured here.

Autocast casts are not cached while capturing (a cached cast would be freed when the autocast context exits while
the graph still reads it); each replay casts again from the live weights.

Python's cyclic garbage collector is run before the warm-up and kept off until the capture ends (`collector_paused`):
torch no longer collects at capture start (`torch.compiler.config.force_cudagraph_gc`), and an automatic collection
in the middle of a capture that frees a dead cycle holding an older graph destroys it while the stream captures, which
invalidates the capture (seen on the H100 with 36 layers: "operation failed due to a previous error during capture").
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

import torch

from nemo_jetrl.precision.kernels.device import warm_up

# step(tokens [B, 1], positions [B, 1], mask [B, S], cache_start) -> logits [B, V]: one decode step over a KV cache
DecodeStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "int | torch.Tensor"], torch.Tensor]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Collect Python's cyclic garbage now, then keep the automatic collector off until the block exits (restored to
    its previous state, also on an exception)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CapturedStep:
    """`fn(*static_inputs) -> Tensor` as a CUDA graph; `__call__(*inputs)` copies inputs in and replays."""

    def __init__(
        self, fn: Callable[..., torch.Tensor], static_inputs: tuple[torch.Tensor, ...], pool: tuple | None = None
    ) -> None:
        if not static_inputs or not all(isinstance(t, torch.Tensor) and t.is_cuda for t in static_inputs):
            raise ValueError("CapturedStep: static_inputs must be CUDA tensors")
        self.fn = fn
        self.pool = pool  # a graph memory pool shared with other captures (`torch.cuda.graph_pool_handle()`)
        self.static_inputs = static_inputs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"CapturedStep: expected {len(self.static_inputs)} inputs, got {len(inputs)}")
        for dst, src in zip(self.static_inputs, inputs):
            if src is not dst:
                dst.copy_(src)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.output

    def _capture(self) -> None:
        autocast = torch.autocast("cuda", enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        with collector_paused(), autocast:
            warm_up([lambda: self.fn(*self.static_inputs)])  # on the GPU's one side stream (cuBLAS: a workspace each)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.output = self.fn(*self.static_inputs)
        self.graph = graph


def rollout_decoder(step: DecodeStep, mask: torch.Tensor, record=None, *, static: bool, graphed: bool) -> Callable:
    """`decode(tokens [B], positions [B], col) -> logits [B, V]` over `step`, writing cache column `col`; mask:
    [B, S_max]. Prefix form (not `static`): mask[:, :col + 1] and an int start; static form: the whole mask and a
    0-dim start tensor filled with `col`, captured in a `CapturedStep` when `graphed`. `record` (an MoE model's
    `RoutingRecord`) takes each step's column as its `start`."""
    if not static:

        def run_prefix(tokens, positions, col):
            if record is not None:
                record.start = col
            return step(tokens[:, None], positions[:, None], mask[:, : col + 1], col)

        return run_prefix
    cache_pos = torch.zeros((), dtype=torch.long, device=mask.device)

    def static_step(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # [B, 1] each
        if record is not None:
            record.start = cache_pos  # read on the device: a captured step writes where the column is
        return step(tokens, positions, mask, cache_pos)

    run_step = static_step
    if graphed:
        static_in = tuple(torch.zeros((mask.shape[0], 1), dtype=torch.long, device=mask.device) for _ in range(2))
        run_step = CapturedStep(static_step, static_in)

    def run(tokens, positions, col):
        cache_pos.fill_(col)
        return run_step(tokens[:, None], positions[:, None])

    return run


def bucket_sizes(max_rows: int, smallest: int = 8) -> list[int]:
    """Batch sizes to capture: powers of two from `smallest` below max_rows, then max_rows itself."""
    sizes, size = [], smallest
    while size < max_rows:
        sizes.append(size)
        size *= 2
    return sizes + [max_rows]


def bucket_for(rows: int, sizes: list[int]) -> int:
    """The smallest bucket that holds `rows` rows."""
    return next(s for s in sizes if s >= rows)


class BucketedSteps:
    """`fn(bucket)(*inputs)` captured per bucket size on first use, all in one graph memory pool.

    make_inputs(bucket) -> the static input tensors of that bucket; `__call__(bucket, *inputs)` replays it."""

    def __init__(self, fn: Callable[[int], Callable[..., torch.Tensor]], make_inputs: Callable[[int], tuple]) -> None:
        self.fn, self.make_inputs = fn, make_inputs
        self.pool = torch.cuda.graph_pool_handle()
        self.steps: dict[int, CapturedStep] = {}

    def __call__(self, bucket: int, *inputs: torch.Tensor) -> torch.Tensor:
        if bucket not in self.steps:
            self.steps[bucket] = CapturedStep(self.fn(bucket), self.make_inputs(bucket), pool=self.pool)
        return self.steps[bucket](*inputs)
