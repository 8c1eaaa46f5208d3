"""Where the GPU sits idle in a profiled step: gaps between kernels and what the host was doing meanwhile.

    python3 -m benchmarks.trace_gaps trace.json.gz [--min-gap-us 5] [--top 25]

Reads a PyTorch profiler chrome trace (`profile_train_step.py --trace`). The device timeline (kernels, memcpys,
memsets) is merged into busy intervals; every idle gap longer than `--min-gap-us` is charged to:
- the host ops that ran during it (CPU ops overlapping the gap, by name, nested ops each counted), and
- "after a sync" when a synchronizing CUDA runtime call (stream / device / event synchronize, a device-to-host
  copy) overlaps the gap: the queue ran dry because the host waited for the device;
- "in the allocator" when the caching allocator's calls into CUDA (cudaMalloc, cudaFree, which also waits for the
  device, or the driver's cuMem* calls of expandable segments) overlap the gap: memory near the device's capacity
  makes the allocator free cached blocks and map new ones between launches;
- the CUDA runtime / driver calls that ran during it, by name (launches, allocations, copies).
A step whose idle time is large against its kernel time is bound by the host, not by the kernels.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from bisect import bisect_left
from collections import defaultdict

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
WAIT_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")  # the host waits
SYNC_CALLS = (*WAIT_CALLS, "cudaMemcpy")  # name prefixes: a blocking copy waits too
ALLOCATOR_CALLS = ("cudaMalloc", "cudaFree", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease",
                   "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess")  # fmt: skip


def load_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def sync_calls(events: list[dict]) -> int:
    """How many CUDA runtime calls in the trace made the host wait for the device (stream, device or event
    synchronize; a blocking copy's wait is one of these)."""
    return sum(1 for e in events if e.get("cat") == "cuda_runtime" and e.get("name") in WAIT_CALLS)


def idle_gaps(events: list[dict], min_gap_us: float) -> tuple[list[tuple[float, float]], float, float]:
    """(gaps [(start, end) us], busy us, span us) of the device timeline."""
    device = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in DEVICE_CATS)
    if not device:
        return [], 0.0, 0.0
    gaps, busy = [], 0.0
    cur_start, cur_end = device[0]
    for start, end in device[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            if start - cur_end >= min_gap_us:
                gaps.append((cur_end, start))
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return gaps, busy, device[-1][1] - device[0][0]


def charge_gaps(events: list[dict], gaps: list[tuple[float, float]]) -> dict:
    """Idle us overlapped per host op name ("ops") and per CUDA runtime / driver call name ("runtime"), and the idle
    us of the gaps that a synchronizing call ("sync_us") or an allocator call ("allocator_us") overlaps."""
    starts = [g[0] for g in gaps]
    by_op: dict[str, float] = defaultdict(float)
    by_runtime: dict[str, float] = defaultdict(float)
    synced, allocating = [False] * len(gaps), [False] * len(gaps)
    for e in events:
        cat = e.get("cat")
        if cat not in ("cpu_op", "cuda_runtime", "cuda_driver", "python_function"):
            continue
        t0, t1 = e["ts"], e["ts"] + e["dur"]
        i = max(bisect_left(starts, t0) - 1, 0)
        while i < len(gaps) and gaps[i][0] < t1:
            overlap = min(t1, gaps[i][1]) - max(t0, gaps[i][0])
            if overlap > 0:
                if cat == "cpu_op":
                    by_op[e["name"]] += overlap
                elif cat != "python_function":
                    by_runtime[e["name"]] += overlap
                    synced[i] = synced[i] or e["name"].startswith(SYNC_CALLS)
                    allocating[i] = allocating[i] or e["name"].startswith(ALLOCATOR_CALLS)
            i += 1

    def idle_where(flags: list[bool]) -> float:
        return sum(end - start for (start, end), flag in zip(gaps, flags) if flag)

    return {"ops": by_op, "runtime": by_runtime, "sync_us": idle_where(synced), "allocator_us": idle_where(allocating)}


def _top_ms(by_name: dict[str, float], top: int) -> dict[str, float]:
    return {name: us / 1e3 for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]}


def report(path: str, min_gap_us: float = 5.0, top: int = 25) -> dict:
    events = load_events(path)
    gaps, busy, span = idle_gaps(events, min_gap_us)
    charged = charge_gaps(events, gaps)
    idle = sum(end - start for start, end in gaps)
    out = {"span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_ms": idle / 1e3, "gaps": len(gaps),
           "sync_calls": sync_calls(events),
           "after_sync_ms": charged["sync_us"] / 1e3, "in_allocator_ms": charged["allocator_us"] / 1e3,
           "top_ops_ms": _top_ms(charged["ops"], top), "top_runtime_ms": _top_ms(charged["runtime"], top)}  # fmt: skip
    print(f"{path}: device span {out['span_ms']:.1f} ms, busy {out['busy_ms']:.1f} ms, idle {out['idle_ms']:.1f} ms "
          f"in {len(gaps)} gaps >= {min_gap_us:g} us; {out['after_sync_ms']:.1f} ms of it after a sync, "
          f"{out['in_allocator_ms']:.1f} ms in the allocator")  # fmt: skip
    for title, rows in (("host ops", out["top_ops_ms"]), ("CUDA runtime / driver calls", out["top_runtime_ms"])):
        print(f" {title} during the gaps:")
        for name, ms in rows.items():
            print(f"  {ms:8.2f} ms  {name[:110]}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--min-gap-us", type=float, default=5.0)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    for path in args.traces:
        report(path, args.min_gap_us, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
