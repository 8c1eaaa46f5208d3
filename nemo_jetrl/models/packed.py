"""Packed rows for the trainer's forward: the real tokens of a padded micro-batch end to end in one row, and the
varlen causal attention that keeps each sequence to itself.

`PackedRows.from_mask(attention_mask [b, w], round_to)` lays the real tokens of each row (row-major, in column
order) into one row of T = (real tokens rounded up to `round_to`) slots; each row with a token is one segment, the
rounding slots one more (pad tokens attending to each other only). Position ids are the padded layout's
(`cumsum(mask) - 1` of the token's own row), so every real token sees the same keys at the same positions as in the
padded forward, and `unpack` returns per-token values in the [b, w] layout (0 elsewhere, differentiable).
`from_mask(..., width=T, segments=n, longest=L)` fixes every shape a packing has (a captured micro-batch replays one
layout for every bin: `policy.train_cuda_graphs`): T slots, n segments (the unused ones empty), L the longest (the
rounding slots split into segments of at most L, so that the varlen kernel's grid follows L, not T).

Attention (`varlen_causal_attention`): on CUDA in bf16/fp16, torch's flash-attention varlen kernel
(`torch.nn.attention.varlen.varlen_attn`, cu_seqlens as flash-attn takes them); elsewhere its twin, SDPA with the
block-diagonal causal mask (exact per-sequence attention); the exact mode and matched kernels run the rollout's
kernel in its varlen form instead (`batch_invariant_train.packed_attention`). FP8 linears see the same tokens: the
1x128 activation groups are per token (FProp and DGrad unchanged), while the WGrad operands' groups of 128 tokens
along M gather other tokens than in the padded layout (no pad tokens among them), so their scales, and the
gradient's last bits, differ (docs/performance.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nemo_jetrl.models.sdpa import sdpa
from nemo_jetrl.utils.transfer import to_device

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - torch without the varlen API: the twin runs everywhere
    varlen_attn = None


@dataclass(frozen=True)
class PackedRows:
    index: torch.Tensor  # [T] long: each slot's flat position (row * w + col) in [b, w]; b * w on the rounding slots
    position_ids: torch.Tensor  # [1, T] long: the padded layout's positions; 0 on the rounding slots
    cu_seqlens: torch.Tensor  # [n_seg + 1] int32: segment starts in the packed row, then T
    max_seqlen: int  # longest segment (an upper bound where the width is fixed)
    shape: tuple[int, int]  # (b, w) of the padded layout

    @classmethod
    def from_mask(
        cls,
        attention_mask: torch.Tensor,
        round_to: int = 1,
        *,
        width: int | None = None,
        segments: int | None = None,
        longest: int | None = None,
    ) -> PackedRows:
        """The packing of `attention_mask` [b, w] (1 = real token) into T = N rounded up to `round_to` (>= 1) slots,
        or exactly `width` slots, with `segments` segments (empty ones appended) of at most `longest` (>= w; default
        the width) tokens each (see module doc)."""
        if attention_mask.dim() != 2 or round_to < 1:
            raise ValueError(f"attention_mask must be [b, w] and round_to >= 1, got {tuple(attention_mask.shape)}")
        real = attention_mask.bool()  # [b, w]
        index = real.flatten().nonzero().flatten()  # [N]
        positions = (real.long().cumsum(-1) - 1).flatten()[index]  # [N]
        lengths = real.sum(-1)  # [b]
        lengths = lengths[lengths > 0]
        total = int(lengths.sum())
        rounded = max(round_to, -(-total // round_to) * round_to)
        if width is not None and width < rounded:
            raise ValueError(f"a packed row of {width} slots cannot hold {total} tokens rounded to {rounded}")
        t = rounded if width is None else width
        if longest is not None and longest < real.shape[1]:
            raise ValueError(f"the longest segment ({longest}) must be at least the row width {real.shape[1]}")
        longest = longest or t
        rounding = [longest] * ((t - total) // longest) + ([(t - total) % longest] if (t - total) % longest else [])
        lengths = torch.cat([lengths, lengths.new_tensor(rounding)])  # the rounding slots' segments
        if segments is not None and segments < len(lengths):
            raise ValueError(f"{len(lengths)} segments (sequences + rounding) exceed the {segments} asked for")
        cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # [n_seg + 1]
        if segments is not None:
            cu = F.pad(cu, (0, segments + 1 - len(cu)), value=t)  # empty segments at the end
        index = F.pad(index, (0, t - total), value=real.numel())  # [T]: the rounding slots point past [b, w]
        pos = F.pad(positions, (0, t - total))[None]  # [1, T]
        bound = longest if width is not None else int(lengths.max())
        return cls(index, pos, cu, bound, (real.shape[0], real.shape[1]))

    @property
    def width(self) -> int:
        return self.position_ids.shape[1]

    def pack(self, x: torch.Tensor, fill: int | float = 0) -> torch.Tensor:
        """x [b, w] -> [1, T]: the real tokens' values in packed order, `fill` on the rounding slots."""
        flat = F.pad(x.flatten(), (0, 1), value=fill)  # [b * w + 1]: the rounding slots read the last
        return flat[self.index.to(x.device)][None]

    def real(self) -> torch.Tensor:
        """[1, T] bool: 1 on the packed real tokens, 0 on the rounding slots."""
        return (self.index < self.shape[0] * self.shape[1])[None]

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """y [1, T] -> [b, w]: each real token's value at its padded position, 0 elsewhere (differentiable)."""
        flat = y.new_zeros(self.shape[0] * self.shape[1] + 1)  # [b * w + 1]: the rounding slots land on the last
        flat = flat.index_put((self.index.to(y.device),), y[0])
        return flat[:-1].view(self.shape)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The packing's tensors, in the order the constructor takes them."""
        return self.index, self.position_ids, self.cu_seqlens

    def to(self, device: torch.device | str) -> PackedRows:
        """On `device` (host -> CUDA through pinned memory, no host sync)."""
        device = torch.device(device)
        moved = (to_device(t, device) for t in self.tensors())
        return PackedRows(*moved, self.max_seqlen, self.shape)


def block_causal_mask(cu_seqlens: torch.Tensor, width: int) -> torch.Tensor:
    """[1, 1, T, T] bool: query i sees key j iff j <= i and both lie in one segment of `cu_seqlens`."""
    slots = torch.arange(width, device=cu_seqlens.device)
    segment = torch.searchsorted(cu_seqlens[1:].long(), slots, right=True)  # [T]
    allowed = (segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None])  # [T, T]
    return allowed[None, None]


def flash_varlen_kwargs(q: torch.Tensor, n_rep: int, scale: float) -> dict | None:
    """`varlen_attn` keywords for these queries across torch versions (causal as `window_size=(-1, 0)` or
    `is_causal=True`; grouped K/V read in place where it takes `enable_gqa`), or None where the flash kernel cannot
    run them (not CUDA bf16 / fp16, no varlen API, or a non-default scale it takes no argument for)."""
    if varlen_attn is None or not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    params = inspect.signature(varlen_attn).parameters
    kwargs: dict = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "scale" in params:
        kwargs["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        return None
    if n_rep > 1 and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return kwargs


def varlen_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedRows, scale: float, repeat_kv: Callable
) -> torch.Tensor:
    """Per-segment causal attention over one packed row: q [1, H, T, D], k/v [1, H_kv, T, D] -> [1, H, T, D]."""
    n_rep = q.shape[1] // k.shape[1]
    kwargs = flash_varlen_kwargs(q, n_rep, scale)
    if kwargs is None or (n_rep > 1 and "enable_gqa" not in kwargs):
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # [1, H, T, D]
    if kwargs is None:  # the twin
        mask = block_causal_mask(packed.cu_seqlens.to(q.device), q.shape[2])  # [1, 1, T, T]
        return sdpa(q, k, v, attn_mask=mask, scale=scale)
    cu = packed.cu_seqlens.to(q.device)
    q3, k3, v3 = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # [T, H(_kv), D]
    out = varlen_attn(q3, k3, v3, cu, cu, packed.max_seqlen, packed.max_seqlen, **kwargs)  # [T, H, D]
    return out.transpose(0, 1)[None]  # [1, H, T, D]
