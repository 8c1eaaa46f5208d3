"""What every Triton wrapper shares: launching on the operand's GPU, and timing candidate launches as the rollout
runs them (back to back inside one CUDA graph, weights cold in L2) to pick a kernel configuration per shape.

Imports torch only, so the kernel modules and the rest of the package (models, generation) take these from here.
"""

from __future__ import annotations

import contextlib
import functools

import torch


def on_device(x: torch.Tensor):
    """Launch on x's GPU; skip the (host-costly) device switch in the common single-device case."""
    if not x.is_cuda or x.device.index == torch.cuda.current_device():  # (CPU: the Triton interpreter in tests)
        return contextlib.nullcontext()
    return torch.cuda.device(x.device)


def cold_copies(weight_bytes: int, device: torch.device, most: int = 32) -> int:
    """How many distinct weights to cycle through so that each call finds its weight out of L2 (as in a decode
    step, where every other layer's weights pass through L2 in between): about twice the L2 size in all."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    return max(2, min(most, -(-2 * l2 // max(weight_bytes, 1))))


@functools.cache
def side_stream(device_index: int) -> torch.cuda.Stream:
    """The one side stream per GPU that eager warm-ups before a capture run on. cuBLAS keeps a workspace per (handle,
    stream) for the life of the process, counted as allocated: a new pool stream per capture left one behind each
    time, up to the pool's 32 (the kernel tuner's captures, the rollout's captured steps)."""
    return torch.cuda.Stream(device=device_index)


def warm_up(calls: list) -> None:
    """`calls` run once eagerly on the GPU's side stream before a capture (Triton JIT, cuBLAS handles, allocations),
    after the current stream's work and before what follows on it."""
    stream = side_stream(torch.cuda.current_device())
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)


def capture_graph(calls: list) -> torch.cuda.CUDAGraph:
    """`calls` run once eagerly on a side stream (JIT, allocations), then captured back to back in one CUDA graph."""
    warm_up(calls)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return graph


def replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    """Milliseconds of one replay of `graph` (CUDA events around it, waited for)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_in_graph(calls: list, replays: int = 7) -> float:
    """Median milliseconds per call of `calls` run back to back inside one CUDA graph (no CPU launch overhead in
    the figure, as in the rollout's captured decode step). The calls run once eagerly first (JIT, allocations)."""
    graph = capture_graph(calls)
    graph.replay()
    times = [replay_ms(graph) / len(calls) for _ in range(replays)]
    del graph
    return sorted(times)[len(times) // 2]
