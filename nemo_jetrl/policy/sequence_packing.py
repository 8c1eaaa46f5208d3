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

from dataclasses import fields

import torch.nn.functional as F

from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.policy.interfaces import TrainBatch

ALGORITHMS = ("modified_first_fit_decreasing", "first_fit_decreasing", "concatenative")
MIN_ROWS = 8  # fewest rows of a captured packed micro-batch (fewer distinct layouts, one graph each)
SLOT_STEPS = 8  # a captured packed row's length is a multiple of 1/8 of the budget (padding <= 1/8 of it)
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


def fixed_packed_window(
    mb: TrainBatch, capacity: int, round_to: int, width: int
) -> tuple[TrainBatch, PackedRows, tuple[slice, slice]]:
    """One packed micro-batch `mb` ([b, w] on the host) in shapes that depend only on (b rounded up to a power of
    two >= MIN_ROWS, its real tokens rounded up to an eighth of `capacity`, `width`), as a captured micro-batch
    replays them (`policy.train_cuda_graphs`; a few layouts per pass, each its own graph):
    - rows: all-padding rows appended up to the power of two; columns: pad columns prepended up to `width`
      (positions follow each row's mask, so no real token's math changes; input ids take `mb`'s first pad id);
    - its packing: the real tokens rounded up to a multiple of SLOT_STEPS-th of the budget (`capacity` rounded up
      to `round_to`: at most that many slots), one segment per row plus the rounding slots' (at most `width` long
      each), the longest segment bounded by `width`.
    Returns (the padded micro-batch, its packing, (rows, cols) of `mb`'s own values in a [b', width] result)."""
    b, w = mb.input_ids.shape
    if w > width:
        raise ValueError(f"a micro-batch of width {w} exceeds the fixed width {width}")
    rows = max(MIN_ROWS, 1 << max(0, b - 1).bit_length())  # b rounded up to a power of two
    pads = mb.attention_mask == 0  # [b, w]
    fill = int(mb.input_ids[pads][0]) if pads.any() else 0  # the first pad's id, as the unpadded packing reads it
    padded = {}
    for f in fields(mb):
        t = getattr(mb, f.name)
        if t is None:
            padded[f.name] = None
        elif t.dim() == 1:  # per sequence [b]
            padded[f.name] = F.pad(t, (0, rows - b))
        else:  # per token [b, w]
            padded[f.name] = F.pad(t, (width - w, 0, 0, rows - b), value=fill if f.name == "input_ids" else 0)
    out = TrainBatch(**padded)
    slots = captured_row_slots(int(mb.attention_mask.bool().sum()), capacity, round_to)
    segments = rows + -(-slots // width)  # the rows', then the rounding slots' in pieces of at most `width`
    packing = PackedRows.from_mask(out.attention_mask, round_to, width=slots, segments=segments, longest=width)
    return out, packing, (slice(0, b), slice(width - w, width))


def captured_row_slots(real_tokens: int, capacity: int, round_to: int) -> int:
    """Slots of a captured packed row holding `real_tokens`: rounded up to a multiple of 1/SLOT_STEPS of the budget
    (`capacity` rounded up to `round_to`), at most the budget."""
    budget = -(-capacity // round_to) * round_to
    step = -(-budget // SLOT_STEPS // round_to) * round_to
    return min(budget, max(step, -(-real_tokens // step) * step))
