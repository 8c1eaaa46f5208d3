"""The best a continuous-batching engine can do on a queue of response lengths it does not know ahead.

Any engine that admits sequences in queue order (first come, first served: the native engine, vLLM's default
scheduler) fills a freed row with the next waiting sequence; the fewest decode steps it can take is the list
schedule that gives each sequence, in order, the row that frees first (`fcfs_decode_steps`; with `refill_every`
k a freed row is refilled at the next multiple of k, and the last rows are seen finished there too, as a host that
syncs every k steps sees them). A decode step's cost
hardly depends on how many rows are live (it streams every weight once), so useful tokens/s follow the row
occupancy, sum(lengths) / (steps x rows), and a long-tailed queue's useful tokens/s over a fixed-length queue's
(occupancy 1) can be no more than this bound, whatever the kernels.

    python3 -m benchmarks.schedule_bound --queue 512 2048 --concurrency 128 256   # the bound per workload
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections.abc import Sequence


def fcfs_decode_steps(lengths: Sequence[int], rows: int, refill_every: int = 1) -> int:
    """Decode steps of the order-preserving schedule: each length (decode steps of one sequence), in queue order,
    on the row that frees first; a row freed at step t takes its next sequence at step ceil(t / k) * k (k =
    refill_every), and the rollout ends at the first multiple of k after the last sequence ends."""
    if rows < 1 or refill_every < 1:
        raise ValueError(f"fcfs_decode_steps: rows and refill_every must be >= 1, got {rows} and {refill_every}")
    free_at = [0] * min(rows, len(lengths))  # the step each row frees at
    end = 0
    for n in lengths:
        start = -(-heapq.heappop(free_at) // refill_every) * refill_every
        end = max(end, start + n)
        heapq.heappush(free_at, start + n)
    return -(-end // refill_every) * refill_every


def occupancy_bound(lengths: Sequence[int], rows: int, refill_every: int = 1) -> float:
    """The highest useful tokens per row and decode step any FCFS schedule reaches on `lengths` with `rows` rows."""
    steps = fcfs_decode_steps(lengths, rows, refill_every)
    return sum(lengths) / (steps * rows) if steps else 1.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queue", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--length-dist", nargs="+", default=["lognormal", "geometric"])
    p.add_argument("--mean-len", type=int, default=512)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--refill-every", type=int, default=16, help="the engine's sync_every (16 on CUDA)")
    args = p.parse_args(argv)
    from benchmarks.common import draw_lengths, print_table

    rows = []
    for dist in args.length_dist:
        for queue in args.queue:
            lengths = draw_lengths(dist, queue, args.mean_len, args.max_len, args.sigma, seed=2)  # as the benchmark
            for conc in args.concurrency:
                fixed = occupancy_bound([args.mean_len] * queue, conc, args.refill_every)
                bound = occupancy_bound(lengths, conc, args.refill_every)
                rows.append([dist, queue, conc, fcfs_decode_steps(lengths, conc, args.refill_every), bound,
                             bound / fixed])  # fmt: skip
    title = (
        f"best FCFS occupancy (lengths mean {args.mean_len}, max {args.max_len}, sigma {args.sigma}, drawn as "
        f"bench_rollout_queue.py draws them; refills every {args.refill_every} steps)"
    )
    print_table(title, ["lengths", "queue", "rows", "decode steps", "occupancy", "x fixed"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
