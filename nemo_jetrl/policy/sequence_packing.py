"""NeMo-RL's sequence packing (`policy.sequence_packing`): which sequences share one packed trainer row.

A bin holds sequences whose real tokens sum to at most the pass's budget (`train_mb_tokens` / `logprob_mb_tokens`);
each bin is one micro-batch (`micro_batches.packed_micro_batches`: its rows and the columns they span), whose real
tokens the trainer's forward lays end to end in one row ([1, T], `models/packed.py`) with varlen causal attention,
so the pass's time follows the real tokens. Logprobs come back in the micro-batch's [b, w] layout, so the loss, the write-back
(`MicroBatch.scatter`) and the normalizer are the padded path's.

Algorithms (NeMo-RL's names): `modified_first_fit_decreasing` (Johnson & Garey's MFFD, NeMo-RL's default),
`first_fit_decreasing`, `concatenative` (batch order, a new bin when the next one does not fit). NeMo-RL's
`first_fit_shuffle` shuffles with an unseeded RNG (runs would not reproduce) and is refused by name.
"""

from __future__ import annotations

ALGORITHMS = ("modified_first_fit_decreasing", "first_fit_decreasing", "concatenative")
REFUSED = {"first_fit_shuffle": "an unseeded random order (runs would not reproduce); use first_fit_decreasing"}


def check_algorithm(name: str) -> None:
    """ValueError naming `policy.sequence_packing.algorithm` for a refused or unknown algorithm."""
    if name in REFUSED:
        raise ValueError(f"policy.sequence_packing.algorithm: {name!r} is not supported here: {REFUSED[name]}")
    if name not in ALGORITHMS:
        raise ValueError(f"policy.sequence_packing.algorithm: {name!r} is not one of {', '.join(ALGORITHMS)}")


def pack_lengths(lengths: list[int], capacity: int, algorithm: str) -> list[list[int]]:
    """Bins of indices into `lengths` (every index once), each bin's lengths summing to at most `capacity`.
    Lengths must be >= 1; one longer than `capacity` is a ValueError naming it."""
    check_algorithm(algorithm)
    if capacity < 1:
        raise ValueError(f"the packing budget must be >= 1 token, got {capacity}")
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError(f"sequence {i} has {n} tokens; packing takes sequences of >= 1 token")
        if n > capacity:
            raise ValueError(
                f"sequence {i} has {n} real tokens, more than the packing budget of {capacity} "
                "(policy.sequence_packing.train_mb_tokens / logprob_mb_tokens): raise it to at least "
                "policy.max_total_sequence_length"
            )
    if algorithm == "concatenative":
        return _concatenative(lengths, capacity)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if algorithm == "first_fit_decreasing":
        return _first_fit(order, lengths, capacity, [], [])
    return _modified_first_fit_decreasing(order, lengths, capacity)


def _concatenative(lengths: list[int], capacity: int) -> list[list[int]]:
    bins: list[list[int]] = []
    used = capacity  # forces a first bin
    for i, n in enumerate(lengths):
        if used + n > capacity:
            bins.append([])
            used = 0
        bins[-1].append(i)
        used += n
    return bins


def _first_fit(
    order: list[int], lengths: list[int], capacity: int, bins: list[list[int]], used: list[int]
) -> list[list[int]]:
    """Each index of `order` into the first of `bins` (loads `used`) it fits in, else a new bin (in place)."""
    for i in order:
        slot = next((b for b, u in enumerate(used) if u + lengths[i] <= capacity), None)
        if slot is None:
            bins.append([])
            used.append(0)
            slot = len(bins) - 1
        bins[slot].append(i)
        used[slot] += lengths[i]
    return bins


def _modified_first_fit_decreasing(order: list[int], lengths: list[int], capacity: int) -> list[list[int]]:
    """Johnson & Garey's MFFD: sizes large (> C/2), medium (> C/3), small (> C/6), tiny. One bin per large item
    (longest first); each takes the largest medium that fits; going back over the bins without a medium, a bin takes
    the smallest small and the largest small that fits beside it; the rest first-fit decreasing (existing bins
    first, then new ones)."""
    large = [i for i in order if 2 * lengths[i] > capacity]
    medium = [i for i in order if 3 * lengths[i] > capacity >= 2 * lengths[i]]
    small = [i for i in reversed(order) if 6 * lengths[i] > capacity >= 3 * lengths[i]]  # ascending
    bins = [[i] for i in large]
    used = [lengths[i] for i in large]
    has_medium = [False] * len(bins)
    for b in range(len(bins)):
        fit = next((m for m in medium if used[b] + lengths[m] <= capacity), None)  # medium is descending
        if fit is not None:
            medium.remove(fit)
            bins[b].append(fit)
            used[b] += lengths[fit]
            has_medium[b] = True
    for b in reversed(range(len(bins))):
        if has_medium[b] or len(small) < 2 or used[b] + lengths[small[0]] + lengths[small[1]] > capacity:
            continue
        first = small.pop(0)
        room = capacity - used[b] - lengths[first]
        second = next(s for s in reversed(small) if lengths[s] <= room)  # small[0] fits: one exists
        small.remove(second)
        bins[b] += [first, second]
        used[b] += lengths[first] + lengths[second]
    placed = {i for b in bins for i in b}
    rest = [i for i in order if i not in placed]  # descending
    return _first_fit(rest, lengths, capacity, bins, used)
