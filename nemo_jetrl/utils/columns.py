"""Column slices of one buffer: when tensors [..., N_i] already lie side by side as the columns of one dense
[..., sum N_i] buffer, their concatenation is a view of it, not a copy.

The trainer's grouped FP8 projections (q/k/v, gate/up) hand out their output as column views of one buffer and
take the members' gradients back as one [..., sum N_i] tensor: where the consumer's backward writes those gradients
into one buffer (the fused SiLU*up), `join_columns` returns that buffer instead of copying it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def adjacent_columns(parts: Sequence[torch.Tensor]) -> bool:
    """Whether `parts` [..., N_i] are, in order, the column slices of one row-major [..., sum N_i] buffer: one
    storage, one dtype, the same leading shape and strides, unit column stride, rows exactly sum N_i apart (dense
    leading dims), and each part starting where the previous one's columns end."""
    first = parts[0]
    total = sum(p.shape[-1] for p in parts)
    if first.dim() < 1:
        return False
    expected = total  # the stride a dense leading dim of the joined buffer has
    for size, stride in zip(reversed(first.shape[:-1]), reversed(first.stride()[:-1])):
        if size > 1 and stride != expected:
            return False
        expected *= size
    offset = first.storage_offset()
    storage = first.untyped_storage().data_ptr()
    for p in parts:
        same_layout = p.shape[:-1] == first.shape[:-1] and p.stride()[:-1] == first.stride()[:-1]
        if not same_layout or p.dtype != first.dtype or p.device != first.device:
            return False
        if p.untyped_storage().data_ptr() != storage or p.storage_offset() != offset:
            return False
        if p.shape[-1] > 1 and p.stride(-1) != 1:
            return False
        offset += p.shape[-1]
    return True


def join_columns(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """`torch.cat(parts, dim=-1)`: a view of their buffer when they are its adjacent column slices
    (`adjacent_columns`), else the copy."""
    if len(parts) > 1 and adjacent_columns(parts):
        first = parts[0]
        total = sum(p.shape[-1] for p in parts)
        strides = (*first.stride()[:-1], 1)
        return first.as_strided((*first.shape[:-1], total), strides, first.storage_offset())
    return torch.cat(list(parts), dim=-1)


def column_buffer(like: torch.Tensor, widths: Sequence[int]) -> list[torch.Tensor]:
    """Fresh column slices [..., N_i] of one new dense [..., sum N_i] buffer (like's leading shape, dtype, device)."""
    buffer = torch.empty((*like.shape[:-1], sum(widths)), dtype=like.dtype, device=like.device)
    return list(buffer.split(list(widths), dim=-1))
