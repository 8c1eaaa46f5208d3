"""An arm against BF16 over a stage's runs (docs/accuracy_long.md): the difference of means, a permutation test within
starts, and the interval of shifts that test does not reject.

The runs of one SFT start (a seed and its repeats, `accuracy_study.py stage --repeats`) differ only in GRPO's
sampling. If the arm made no difference, the arm labels of one start's runs would be exchangeable: the p-value is
the fraction of relabelings, each start's runs relabeled among themselves, whose difference of means is at least as
far from 0 as the observed one (two-sided). Exact when there are at most MAX_EXACT relabelings, else estimated from
SAMPLES random ones (fixed seed, `(hits + 1) / (SAMPLES + 1)`). With one run per arm and start, p cannot fall below
2 / 2^starts: such a stage cannot tell an arm from chance, and the test says so.

The interval inverts the test: the shifts d for which "the arm's runs minus d are exchangeable with BF16's" gets
p >= alpha. It holds the true shift with probability 1 - alpha where the arm moves every run by one amount; it says
how large a gap the runs could have missed (Jet-RL reports FP8 rollout only about 0.1 below BF16). Unbounded where
the runs allow no p below alpha.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import numpy as np

MAX_EXACT = 200_000
SAMPLES = 20_000
TIE = 1e-12  # relabelings whose |difference| is the observed one up to rounding count as at least as far
ALPHA = 0.05
GRID = 64  # points a side of the difference where the interval's end is looked for, then bisected
BISECT = 30


def _relabelings(pool_sizes: list[int], arm_sizes: list[int]) -> tuple[np.ndarray, bool]:
    """Every relabeling within starts (at most MAX_EXACT) or SAMPLES random ones (fixed seed), as 0/1 rows over the
    runs, start by start (rows, runs); and whether they are all of them."""
    count = math.prod(math.comb(n, k) for n, k in zip(pool_sizes, arm_sizes))
    if count <= MAX_EXACT:
        choices = itertools.product(*(itertools.combinations(range(n), k) for n, k in zip(pool_sizes, arm_sizes)))
        exact, rows = True, count
    else:
        rng = random.Random(0)
        choices = ([rng.sample(range(n), k) for n, k in zip(pool_sizes, arm_sizes)] for _ in range(SAMPLES))
        exact, rows = False, SAMPLES
    offsets = np.cumsum([0, *pool_sizes[:-1]])
    picked = np.zeros((rows, sum(pool_sizes)))  # (rows, runs)
    for r, chosen in enumerate(choices):
        picked[r, [off + j for off, picks in zip(offsets, chosen) for j in picks]] = 1.0
    return picked, exact


class _ShiftedTest:
    """The permutation test of `a`'s runs shifted by -d against `b`'s, for any d: each relabeling's difference of
    means is linear in d (`diffs - d * slopes`), the observed one's `observed - d`."""

    def __init__(self, pools: list[list[float]], arm_sizes: list[int]) -> None:
        values = np.array([v for pool in pools for v in pool])  # (runs,)
        in_a = np.array([float(j < k) for pool, k in zip(pools, arm_sizes) for j in range(len(pool))])  # (runs,)
        self.n_a, self.n_b = int(in_a.sum()), len(values) - int(in_a.sum())
        picked, self.exact = _relabelings([len(p) for p in pools], arm_sizes)  # (rows, runs)
        self.rows = len(picked)
        sum_a = picked @ values  # (rows,)
        self.diffs = sum_a / self.n_a - (values.sum() - sum_a) / self.n_b
        kept_a = picked @ in_a  # (rows,) runs of `a` a relabeling keeps labeled `a`
        self.slopes = kept_a / self.n_a - (self.n_a - kept_a) / self.n_b
        self.observed = float(values @ in_a / self.n_a - values @ (1 - in_a) / self.n_b)

    def p(self, shift: float = 0.0) -> float:
        hits = int(np.sum(np.abs(self.diffs - shift * self.slopes) >= abs(self.observed - shift) - TIE))
        return hits / self.rows if self.exact else (hits + 1) / (self.rows + 1)

    def interval_end(self, direction: float, span: float, alpha: float) -> float | None:
        """The first shift from the observed difference towards `direction` the test rejects (p < alpha), to a
        bisection's precision; None where none within GRID x `span` does."""
        inside = self.observed
        for step in range(1, GRID + 1):
            probe = self.observed + direction * span * step
            if self.p(probe) < alpha:
                for _ in range(BISECT):
                    mid = (inside + probe) / 2
                    inside, probe = (inside, mid) if self.p(mid) < alpha else (mid, probe)
                return inside
            inside = probe
        return None


def permutation_test(a: dict[str, list[float]], b: dict[str, list[float]], alpha: float = ALPHA) -> dict[str, Any]:
    """`a`, `b`: each arm's values by start. Only starts that both arms ran count. Returns the observed difference
    (mean of `a` minus mean of `b`), the two-sided p-value, the runs of each arm, the starts, the relabelings
    (their count when exact), whether p is exact, each start's own difference of means (`by_start`, whether the
    starts agree) and the 1 - alpha interval of the shift (`interval`: [low, high], an end None where unbounded);
    `diff` and `p` are None without a shared start."""
    starts = [s for s in a if a[s] and b.get(s)]
    n_a, n_b = sum(len(a[s]) for s in starts), sum(len(b[s]) for s in starts)
    by_start = {s: sum(a[s]) / len(a[s]) - sum(b[s]) / len(b[s]) for s in starts}
    out: dict[str, Any] = {"diff": None, "p": None, "runs": [n_a, n_b], "starts": len(starts), "relabelings": 0,
                           "by_start": by_start, "interval": [None, None]}  # fmt: skip
    if not starts:
        return out | {"exact": True}
    pools = [list(a[s]) + list(b[s]) for s in starts]  # each start's runs, `a`'s first
    test = _ShiftedTest(pools, [len(a[s]) for s in starts])
    values = [v for pool in pools for v in pool]
    span = max(max(values) - min(values), 1e-6) / 8  # the grid reaches 8 x the runs' range each side
    interval = [test.interval_end(-1.0, span, alpha), test.interval_end(1.0, span, alpha)]
    return out | {"diff": test.observed, "p": test.p(), "relabelings": test.rows, "exact": test.exact,
                  "interval": interval}  # fmt: skip


POWER = 0.8


def within_start_sd(groups: list[dict[str, list[float]]]) -> tuple[float | None, int]:
    """The standard deviation of runs around their own start's mean, pooled over every start with two or more runs
    in any of `groups` (each {start: [run values]}, e.g. one per arm), and its degrees of freedom; (None, 0) without
    a repeated start."""
    squares, dof = 0.0, 0
    for group in groups:
        for values in group.values():
            if len(values) > 1:
                squares += float(np.var(values, ddof=1)) * (len(values) - 1)
                dof += len(values) - 1
    return (math.sqrt(squares / dof), dof) if dof else (None, 0)


def runs_needed(sd: float, gap: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Runs per arm for a two-sided test at `alpha` to find a shift of `gap` with probability `power` when runs
    scatter by `sd` (normal approximation, runs of one start: 2 (z_(1-alpha/2) + z_power)^2 sd^2 / gap^2)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return math.ceil(2 * z * z * sd * sd / (gap * gap))
