"""How a trainer pass cuts its rows into micro-batches: fixed row counts, or NeMo-RL's dynamic batching.

Fixed (`policy.train_micro_batch_size` / `logprob_batch_size`): contiguous rows, the batch's full width.

Dynamic (`policy.dynamic_batching.enabled`): rows sorted by where their last real token lies, longest first, packed
greedily while rows x window width stays within the pass's token budget (`train_mb_tokens` / `logprob_mb_tokens`);
each micro-batch keeps only the columns its rows use (the window from its earliest first real token to its latest
last one, widened to a multiple of `sequence_length_round` with pad columns). Cutting away columns where every row
of the micro-batch is padding leaves each real token's math unchanged (positions come from the attention mask), so
the time of a pass follows the real tokens of long-tailed responses instead of the longest row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nemo_jetrl.policy.sequence_packing import pack_lengths


@dataclass(frozen=True)
class MicroBatch:
    rows: torch.Tensor  # [b] long: row indices into the pass's batch, in the order they are computed
    cols: slice  # the columns computed; every real token of `rows` lies inside

    def __len__(self) -> int:
        return len(self.rows)

    def scatter(self, into: torch.Tensor, values: torch.Tensor) -> None:
        """Write this micro-batch's per-token `values` [b, w] back into the pass's [B, S] tensor `into`."""
        into[self.rows, self.cols] = values.to(into.device, into.dtype)


def fixed_micro_batches(num_rows: int, rows_per_micro_batch: int, width: int) -> list[MicroBatch]:
    """Contiguous chunks of `rows_per_micro_batch` rows over the full width (the last one may be shorter)."""
    return [
        MicroBatch(torch.arange(lo, min(lo + rows_per_micro_batch, num_rows)), slice(0, width))
        for lo in range(0, num_rows, rows_per_micro_batch)
    ]


def _spans(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(has a real token [B] bool, first real column [B] (S for none), last real column [B] (-1 for none))."""
    width = attention_mask.shape[1]
    real = attention_mask.bool()  # [B, S]
    cols = torch.arange(width)
    first = torch.where(real, cols, width).min(-1).values  # [B]
    last = torch.where(real, cols, -1).max(-1).values  # [B]
    return real.any(-1), first, last


def token_budget_micro_batches(attention_mask: torch.Tensor, max_tokens: int, round_to: int = 1) -> list[MicroBatch]:
    """Dynamic batching over `attention_mask` [B, S] (see module docstring). A row wider than the budget alone still
    forms its own micro-batch; an all-padding row joins the last micro-batch."""
    if max_tokens < 1 or round_to < 1:
        raise ValueError(f"max_tokens and round_to must be >= 1, got {max_tokens}, {round_to}")
    width = attention_mask.shape[1]
    has_token, first, last = _spans(attention_mask)
    order = sorted(range(len(has_token)), key=lambda r: (-int(last[r]), int(first[r]), r))  # longest reach first
    groups: list[list[int]] = []
    lo = hi = 0
    for r in (r for r in order if has_token[r]):
        if groups:
            new_lo, new_hi = min(lo, int(first[r])), max(hi, int(last[r]) + 1)
            if (len(groups[-1]) + 1) * _rounded(new_hi - new_lo, round_to, width) <= max_tokens:
                groups[-1].append(r)
                lo, hi = new_lo, new_hi
                continue
        groups.append([r])
        lo, hi = int(first[r]), int(last[r]) + 1
    empty = [r for r in order if not has_token[r]]
    if not groups:
        return [MicroBatch(torch.tensor(empty, dtype=torch.long), slice(0, min(width, round_to)))] if empty else []
    groups[-1].extend(empty)
    out = []
    for rows in groups:
        r = torch.tensor(rows, dtype=torch.long)
        lo, hi = int(first[r].min()), int(last[r].max()) + 1
        span = _rounded(hi - lo, round_to, width)
        start = max(0, min(lo, hi - span))  # widen to the left (pad columns), then to the right where needed
        out.append(MicroBatch(r, slice(start, min(width, start + span))))
    return out


def packed_micro_batches(attention_mask: torch.Tensor, max_tokens: int, algorithm: str) -> list[MicroBatch]:
    """Sequence packing over `attention_mask` [B, S]: one micro-batch per bin of `pack_lengths` (rows ascending),
    over the columns from its earliest first real token to its latest last one; all-padding rows join the last."""
    has_token, first, last = _spans(attention_mask)
    lengths = attention_mask.bool().sum(-1)  # [B]
    rows = has_token.nonzero().flatten().tolist()
    bins = [sorted(rows[i] for i in b) for b in pack_lengths([int(lengths[r]) for r in rows], max_tokens, algorithm)]
    empty = (~has_token).nonzero().flatten().tolist()
    if not bins:
        return [MicroBatch(torch.tensor(empty, dtype=torch.long), slice(0, 1))] if empty else []
    bins[-1] += empty
    out = []
    for b in bins:
        r = torch.tensor(b, dtype=torch.long)
        out.append(MicroBatch(r, slice(int(first[r].min()), int(last[r].max()) + 1)))
    return out


def _rounded(n: int, round_to: int, width: int) -> int:
    return min(width, -(-max(n, 1) // round_to) * round_to)


def plan_micro_batches(attention_mask: torch.Tensor, policy_cfg: Any, kind: str) -> list[MicroBatch]:
    """The micro-batches of one trainer pass over `attention_mask` [B, S] under a `PolicyConfig`; `kind`: "train"
    (the training forward and backward) or "logprob" (no-grad logprob, reference and calibration forwards)."""
    if kind not in ("train", "logprob"):
        raise ValueError(f"kind must be 'train' or 'logprob', got {kind!r}")
    dyn, pack = policy_cfg.dynamic_batching, policy_cfg.sequence_packing
    if dyn.enabled and pack.enabled:
        raise ValueError(
            "policy.dynamic_batching.enabled and policy.sequence_packing.enabled exclude each other (as in NeMo-RL)"
        )
    if not (pack.enabled or dyn.enabled):
        return fixed_micro_batches(attention_mask.shape[0], _rows(policy_cfg, kind), attention_mask.shape[1])
    budget = token_budget(policy_cfg, kind)
    if pack.enabled:
        return packed_micro_batches(attention_mask, budget, pack.algorithm)
    return token_budget_micro_batches(attention_mask, budget, dyn.sequence_length_round)


def _rows(policy_cfg: Any, kind: str) -> int:
    """Rows per micro-batch of a `kind` pass (`train_micro_batch_size` / `logprob_batch_size`)."""
    return policy_cfg.train_micro_batch_size if kind == "train" else policy_cfg.logprob_batch_size


def token_budget(policy_cfg: Any, kind: str) -> int:
    """Tokens per micro-batch of a `kind` pass under sequence packing or dynamic batching (a `PolicyConfig`):
    `{kind}_mb_tokens`, or the pass's rows per micro-batch x `max_total_sequence_length`."""
    pack = policy_cfg.sequence_packing
    chosen = pack if pack.enabled else policy_cfg.dynamic_batching
    given = chosen.train_mb_tokens if kind == "train" else chosen.logprob_mb_tokens
    return int(given or _rows(policy_cfg, kind) * policy_cfg.max_total_sequence_length)
