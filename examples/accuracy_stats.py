"""An arm against BF16 over a stage's runs (docs/accuracy.md): the difference of means and a permutation test
within starts.

The runs of one SFT start (a seed and its repeats, `accuracy_study.py stage --repeats`) differ only in GRPO's
sampling. If the arm made no difference, the arm labels of one start's runs would be exchangeable: the p-value is
the fraction of relabelings, each start's runs relabeled among themselves, whose difference of means is at least as
far from 0 as the observed one (two-sided). Exact when there are at most MAX_EXACT relabelings, else estimated from
SAMPLES random ones (fixed seed, `(hits + 1) / (SAMPLES + 1)`). With one run per arm and start, p cannot fall below
2 / 2^starts: such a stage cannot tell an arm from chance, and the test says so.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

MAX_EXACT = 200_000
SAMPLES = 20_000
TIE = 1e-12  # relabelings whose |difference| is the observed one up to rounding count as at least as far


def _difference(pools: list[list[float]], chosen: list[tuple[int, ...]], n_a: int, n_b: int, total: float) -> float:
    """Mean of the runs labeled `a` (`chosen[i]`: their indices in start i's pool) minus the mean of the rest."""
    sum_a = sum(pool[j] for pool, picks in zip(pools, chosen) for j in picks)
    return sum_a / n_a - (total - sum_a) / n_b


def permutation_test(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, Any]:
    """`a`, `b`: each arm's values by start. Only starts that both arms ran count. Returns the observed difference
    (mean of `a` minus mean of `b`), the two-sided p-value, the runs of each arm, the starts, the relabelings
    (their count when exact), whether p is exact, and each start's own difference of means (`by_start`, whether
    the starts agree); `diff` and `p` are None without a shared start."""
    starts = [s for s in a if a[s] and b.get(s)]
    n_a, n_b = sum(len(a[s]) for s in starts), sum(len(b[s]) for s in starts)
    by_start = {s: sum(a[s]) / len(a[s]) - sum(b[s]) / len(b[s]) for s in starts}
    out: dict[str, Any] = {"diff": None, "p": None, "runs": [n_a, n_b], "starts": len(starts), "relabelings": 0,
                           "by_start": by_start}  # fmt: skip
    if not starts:
        return out | {"exact": True}
    pools = [list(a[s]) + list(b[s]) for s in starts]  # each start's runs, `a`'s first
    sizes = [len(a[s]) for s in starts]
    total = sum(sum(pool) for pool in pools)
    observed = _difference(pools, [tuple(range(k)) for k in sizes], n_a, n_b, total)
    count = math.prod(math.comb(len(pool), k) for pool, k in zip(pools, sizes))
    if count <= MAX_EXACT:
        choices = itertools.product(*(itertools.combinations(range(len(p)), k) for p, k in zip(pools, sizes)))
        hits = sum(abs(_difference(pools, list(c), n_a, n_b, total)) >= abs(observed) - TIE for c in choices)
        p, exact, tried = hits / count, True, count
    else:
        rng = random.Random(0)

        def sampled() -> float:
            chosen = [tuple(rng.sample(range(len(pool)), k)) for pool, k in zip(pools, sizes)]
            return _difference(pools, chosen, n_a, n_b, total)

        hits = sum(abs(sampled()) >= abs(observed) - TIE for _ in range(SAMPLES))
        p, exact, tried = (hits + 1) / (SAMPLES + 1), False, SAMPLES
    return out | {"diff": observed, "p": p, "relabelings": tried, "exact": exact}
