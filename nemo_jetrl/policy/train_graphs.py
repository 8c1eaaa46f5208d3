"""The trainer's micro-batches captured in CUDA graphs and replayed (`policy.train_cuda_graphs`): the training pass's
(forward, loss, backward) and the no-grad logprob pass's forward (prev_logprobs, the KV-scale calibration).

An FP8 linear launches about seven kernels per forward + backward (quantizers, GEMMs), each costing tens of us of
Python and launcher time, so at widths where the kernels are short the FP8 trainer waits on its host
(docs/performance.md). A replay launches the whole micro-batch at once.

What a graph bakes in is every tensor address the micro-batch touches:
- the batch: static device buffers, each micro-batch copied into them (pinned, non-blocking) before the replay;
  with sequence packing its packing too, both in one of a few fixed layouts (`sequence_packing.fixed_packed_window`:
  the packed row padded to a multiple of 1/8 of the pass's token budget, the rows to a power of two), so one graph
  serves every bin of that layout;
- the loss normalizer: a 0-d device tensor filled before the replay;
- the parameters, and their gradients, which the captured backward accumulates in place: the trainer zeroes them
  in place (`zero_grad(set_to_none=False)`) instead of dropping them;
- the FP8 weight caches, which the trainer re-quantizes in place after each optimizer step
  (`Fp8Linear.requantize_in_place`) instead of dropping them;
- the K/V fake-quant scales (`train_kv_fake_quant`), which the trainer sets in place.
A forward that observes Q/K/V for the KV-scale calibration returns its per-layer amax [L, 3] as an output (a
scratch calibrator's record inside the graph), which the trainer hands to its calibrator after the replay.
`MicroBatchGraphs.check_state` runs once per optimizer step and drops every graph when one of these was replaced
(a non-finite step drops the gradients, a checkpoint load re-quantizes, ...); the next micro-batches capture again.

A shape's first micro-batch runs eagerly (the warm-up: Triton compiles and autotunes, cuBLAS picks workspaces), its
second is captured and replayed, later ones replay. Micro-batches differ in shape as their padded lengths do, so
every shape seen gets its graph (at most `max_graphs`; beyond, the oldest is dropped). The graphs share one memory
pool: the activations of one micro-batch stay reserved between steps, and each replay's outputs are copied out
before the next replay may reuse that memory. When every graph is dropped the pool goes with them, and the next
capture opens a new one (CUDA's allocator refuses a capture into a pool that no live graph holds).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import torch
from torch import nn

from nemo_jetrl.generation.native.cuda_graph import collector_paused
from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.precision import Fp8Linear, is_fp8_layer

# fn(mb on the device, normalizer 0-d device tensor, mb's packing on the device or None) -> (logprobs [b, w] or
# None, {name: tensor}), the tensors small (0-d metrics, a [L, 3] amax record)
MicroBatchFn = Callable[
    [TrainBatch, torch.Tensor, PackedRows | None], tuple[torch.Tensor | None, dict[str, torch.Tensor]]
]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    batch: TrainBatch  # static device buffers
    normalizer: torch.Tensor  # 0-d float32
    values: torch.Tensor  # [n] float64: the outputs, flattened and concatenated inside the graph
    shapes: dict[str, torch.Size]  # each output's name and shape, in `values` order
    logprobs: torch.Tensor | None  # [b, w] float32
    packing: PackedRows | None  # static device buffers


def batch_key(batch: TrainBatch, *flags, packing: PackedRows | None = None) -> tuple:
    """What a captured micro-batch depends on besides tensor contents: each field's shape and dtype (or None), and
    the packing's shapes."""
    packed = None if packing is None else (packing.width, len(packing.cu_seqlens), packing.max_seqlen, packing.shape)
    return (*flags, packed, *((f.name, None if (t := getattr(batch, f.name)) is None else (tuple(t.shape), t.dtype))
                              for f in fields(batch)))  # fmt: skip


class MicroBatchGraphs:
    """Captured micro-batches of one model, keyed by `batch_key`; see the module docstring."""

    def __init__(
        self, model: nn.Module, max_graphs: int = 16, watched: Callable[[], list[torch.Tensor]] | None = None
    ) -> None:
        """`watched`: other tensors the micro-batch reads (e.g. the K/V fake-quant scales), checked like parameters."""
        self.model = model
        self.watched = watched or list
        self.max_graphs = max_graphs
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: OrderedDict[tuple, _Captured] = OrderedDict()  # in capture order (the oldest goes first)
        self.warm: set[tuple] = set()  # keys run eagerly once
        self._baked: tuple | None = None  # the addresses the graphs read (`_state`)
        self.captures = self.replays = self.resets = self.evictions = 0

    def _state(self) -> tuple:
        """Parameter and gradient storages, the FP8 weight caches' objects and storages, the watched tensors."""
        params = tuple(
            (p.data_ptr(), None if p.grad is None else p.grad.data_ptr()) for p in self.model.parameters()
        )  # fmt: skip
        caches = tuple(
            (id(m._qweight), m._qweight.data.data_ptr()) if m._qweight is not None else None
            for m in self.model.modules()
            if isinstance(m, Fp8Linear)
        )
        return params, caches, tuple(t.data_ptr() for t in self.watched())

    def check_state(self) -> None:
        """Drop every graph when a parameter, gradient or FP8 weight cache was replaced since the captures."""
        if self.graphs and self._state() != self._baked:
            self.reset()

    def pool_bytes(self) -> int:
        """Device memory the graphs' pool holds now (reserved between replays; not counted as allocated)."""
        segments = torch.cuda.memory_snapshot()
        return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(self.pool))

    def reset(self) -> None:
        """Drop every graph (and their pool: the next capture opens a new one) and the warm-up marks."""
        self._drop_all()
        self.warm.clear()
        self._baked = None
        self.resets += 1

    def _drop_all(self) -> None:
        self.graphs.clear()
        self.pool = torch.cuda.graph_pool_handle()

    def run(
        self, key: tuple, host_mb: TrainBatch, normalizer: float, fn: MicroBatchFn, packing: PackedRows | None = None
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """fn's outputs for `host_mb` (and its `packing`, both on the host): eager at a key's first call, captured
        at its second, replayed after. Replayed outputs are copies (the next replay overwrites the graph's)."""
        device = next(self.model.parameters()).device
        captured = self.graphs.get(key)
        if captured is None:
            mb, packed = host_mb.to(device), None if packing is None else packing.to(device)
            norm = torch.full((), normalizer, dtype=torch.float32, device=device)
            if key not in self.warm:
                self.warm.add(key)
                return fn(mb, norm, packed)
            if len(self.graphs) >= self.max_graphs:
                self.graphs.popitem(last=False)  # the oldest shape; the others keep the pool alive
                self.evictions += 1
            captured = self._capture(key, mb, norm, packed, fn)
        else:
            pairs = [(getattr(captured.batch, f.name), getattr(host_mb, f.name)) for f in fields(host_mb)]
            if packing is not None:
                pairs += zip(captured.packing.tensors(), packing.tensors())
            for dst, src in pairs:
                if src is not None:
                    dst.copy_(src.pin_memory(), non_blocking=True)
            captured.normalizer.fill_(normalizer)
        captured.graph.replay()
        self.replays += 1
        values = captured.values.clone()  # [n]
        logprobs = None if captured.logprobs is None else captured.logprobs.clone()
        sizes = [shape.numel() for shape in captured.shapes.values()]
        parts = values.split(sizes) if sizes else []
        return logprobs, {n: t.view(shape) for (n, shape), t in zip(captured.shapes.items(), parts)}

    def _capture(
        self, key: tuple, mb: TrainBatch, norm: torch.Tensor, packing: PackedRows | None, fn: MicroBatchFn
    ) -> _Captured:
        # The key's eager warm-up made the gradient of every parameter fn uses (the trainer keeps them since), so
        # the captured backward accumulates into storage that outlives the capture.
        before = self._state()
        if self._baked is not None and before != self._baked:
            self._drop_all()
        graph = torch.cuda.CUDAGraph()
        with collector_paused(), torch.cuda.graph(graph, pool=self.pool):
            logprobs, outputs = fn(mb, norm, packing)
            shapes = {n: t.shape for n, t in outputs.items()}
            flat = [t.detach().reshape(-1).double() for t in outputs.values()]
            values = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float64, device=norm.device)  # [n]
        if self._state() != before:  # e.g. a gradient accumulated out of place: the replays would be wrong
            raise RuntimeError(
                "policy.train_cuda_graphs: the captured micro-batch replaced a parameter, gradient or FP8 weight "
                "cache; set policy.train_cuda_graphs: false"
            )
        self._baked = before
        self.captures += 1
        logprobs = None if logprobs is None else logprobs.detach()
        captured = _Captured(graph, mb, norm, values, shapes, logprobs, packing)
        self.graphs[key] = captured
        return captured


def requantize_fp8_in_place(modules: Iterable[nn.Module]) -> None:
    """Every FP8 layer's cached weight re-quantized into its own tensors (one pass per weight group)."""
    groups = set()
    for m in modules:
        if is_fp8_layer(m):
            if m.weight_group is not None:
                if id(m.weight_group) in groups:
                    continue
                groups.add(id(m.weight_group))
            m.requantize_in_place()
