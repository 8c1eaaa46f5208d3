"""The trainer's batch-invariant attention (the exact mode, `policy.generation.matched_kernels`): one autograd Function
whose forward is the rollout's kernel (`batch_invariant_attention`: per query the reduction order of the decode and
prefill; on sm_90 its CUDA twin `exact_train_cuda`, the same bits, where `exact_cuda_choice` found them equal) and
also writes each query's log-sum-exp, and whose backward is flash attention's over that output and
log-sum-exp (`torch.ops.aten._flash_attention_backward`, varlen over cu_seqlens): no forward recomputed for the
gradient.

Two layouts:
- padded rows (`causal_attention`): q [B, H, S, D], k / v [B, H_kv, S, D], key_valid [B, S], every row's real
  tokens contiguous (the shared layout: left-padded prompt, response, right pads). For the backward each row is
  three segments of one [B * S]-token varlen batch: its leading pads, its real tokens, its trailing pads.
- one packed row (`packed_attention`, `policy.sequence_packing`): q [1, H, T, D] over the segments of a
  `models.packed.PackedRows`; the Triton kernel's VARLEN mode runs each segment as its own row with key blocks
  aligned to the segment's first token, so a packed token gets the bits the padded layout, the prefill and the
  decode give it.

Pad queries are never scored (their logprobs are masked out), so they take no gradient: their log-sum-exp is set to
+inf, which makes their attention probabilities 0 in the backward (flash attention's own convention for a row that
sees no key). log-sum-exp layout: float32 [H, rows], natural log, row = b * S + s (padded) or the packed slot.

Where flash attention cannot run (CPU, float32, a head dim it does not take) the twin backward runs: the same
formulas over the same output and log-sum-exp (P = exp(s - lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO O)),
dQ = dS K scale, dK = dS^T Q scale) in float64, over chunks of queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_jetrl.models.batch_invariant_attention import REF_QUERY_CHUNK, _check, attention_ref
from nemo_jetrl.models.packed import PackedRows


@dataclass(frozen=True)
class _Layout:
    """Where the queries' keys lie: padded rows (`key_valid` [B, S]) or one packed row (`cu_seqlens`, `max_seqlen`)."""

    key_valid: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None  # int32 [n + 1]
    max_seqlen: int = 0

    def allowed(self, lo: int, hi: int, width: int) -> torch.Tensor:
        """[B | 1, 1, hi - lo, width] bool: which keys the queries lo..hi-1 see (the twin backward's mask)."""
        device = (self.key_valid if self.key_valid is not None else self.cu_seqlens).device
        cols = torch.arange(width, device=device)
        rows = torch.arange(lo, hi, device=device)
        causal = cols[None, :] <= rows[:, None]  # [c, S]
        if self.key_valid is None:  # one packed row: the same segment too
            segment = torch.searchsorted(self.cu_seqlens[1:].long(), cols, right=True)  # [S]
            return (causal & (segment[lo:hi, None] == segment[None, :]))[None, None]
        return (causal[None] & self.key_valid[:, None, :width].bool())[:, None]

    def segments(self, bsz: int, seq: int) -> tuple[torch.Tensor, int]:
        """(cu_seqlens int32, longest) of the varlen batch flash attention's backward runs over."""
        if self.key_valid is None:
            return self.cu_seqlens, self.max_seqlen
        valid = self.key_valid[:, :seq].bool()  # [B, S]
        count = valid.sum(-1)  # [B] real tokens
        lead = (valid.long().cumsum(-1) == 0).sum(-1)  # [B] leading pads (S for a row without tokens)
        trail = (valid.long().flip(-1).cumsum(-1) == 0).sum(-1)  # [B] trailing pads
        torch._assert_async(((count == 0) | (lead + count + trail == seq)).all())  # real tokens contiguous
        starts = torch.arange(bsz, device=valid.device) * seq  # [B]
        bounds = torch.stack([starts, starts + lead, starts + lead + count], 1).flatten()  # [3B]
        end = torch.full((1,), bsz * seq, dtype=bounds.dtype, device=bounds.device)
        return torch.cat([bounds, end]).int(), seq


class _BatchInvariantAttention(torch.autograd.Function):
    """out = batch-invariant attention (module docstring); backward: flash attention's, or the float64 twin."""

    @staticmethod
    def forward(ctx, q, k, v, layout: _Layout, sm_scale: float):
        out, lse = _forward(q, k, v, layout, sm_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.sm_scale = layout, sm_scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        if flash_backward_runs(q):
            cu, longest = ctx.layout.segments(q.shape[0], q.shape[2])
            dq, dk, dv = _flash_backward(d_out, q, k, v, out, lse, cu, longest, ctx.sm_scale)
        else:
            dq, dk, dv = _twin_backward(d_out, q, k, v, out, lse, ctx.layout, ctx.sm_scale)
        return dq, dk, dv, None, None


def trainer_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor | PackedRows, sm_scale: float
):
    """`decoder_forward`'s attention in the exact mode / with matched kernels without a cache (the trainer): over
    padded rows (`rows` = key_valid [B, S]) or one packed row (`rows` a `PackedRows`); differentiable."""
    if isinstance(rows, PackedRows):
        return packed_attention(q, k, v, rows, sm_scale)
    return causal_attention(q, k, v, rows, sm_scale)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor, sm_scale: float):
    """The trainer's forward over padded rows: q [B, H, S, D], k / v [B, H_kv, S, D] of the sequence itself (no
    cache), key_valid [B, S] -> [B, H, S, D]; differentiable."""
    layout = _Layout(key_valid=key_valid)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _BatchInvariantAttention.apply(q, k, v, layout, sm_scale)
    return _forward(q, k, v, layout, sm_scale)[0]


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedRows, sm_scale: float):
    """The trainer's forward over one packed row: q [1, H, T, D], k / v [1, H_kv, T, D] -> [1, H, T, D], each
    segment of `packed` attending causally to itself; differentiable."""
    layout = _Layout(cu_seqlens=packed.cu_seqlens.to(q.device), max_seqlen=packed.max_seqlen)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _BatchInvariantAttention.apply(q, k, v, layout, sm_scale)
    return _forward(q, k, v, layout, sm_scale)[0]


def _forward(q, k, v, layout: _Layout, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, H, S, D], lse float32 [H, B * S]); pad queries' lse +inf."""
    bsz, heads, seq, _ = q.shape
    if layout.key_valid is None:
        if q.is_cuda:
            from nemo_jetrl.models import batch_invariant_kernels, exact_cuda_choice, exact_train_cuda

            cu = layout.cu_seqlens.int()
            if exact_cuda_choice.train_serves(q, k, v, packed=True):  # the same bits (exact_train_cuda)
                return exact_train_cuda.forward(q, k, v, None, cu, layout.max_seqlen, sm_scale)
            return batch_invariant_kernels.varlen_attention(q, k, v, cu, layout.max_seqlen, sm_scale)
        return varlen_attention_ref(q, k, v, layout.cu_seqlens, sm_scale)
    key_valid = layout.key_valid
    _check(q, k, v, key_valid, None, None)
    if q.is_cuda:
        from nemo_jetrl.models import batch_invariant_kernels, exact_cuda_choice, exact_train_cuda

        if exact_cuda_choice.train_serves(q, k, v, packed=False, key_valid=key_valid):  # the same bits (exact_train_cuda)
            out, lse = exact_train_cuda.forward(q, k, v, key_valid, None, 0, sm_scale)
        else:
            out, lse = batch_invariant_kernels.padded_train_attention(q, k, v, key_valid, sm_scale)
    else:
        out, lse3 = attention_ref(q, k, v, key_valid, 0, sm_scale, with_lse=True)  # lse3: [B, H, S]
        lse = lse3.transpose(0, 1).reshape(heads, bsz * seq)
    pads = ~key_valid[:, :seq].bool().reshape(1, bsz * seq)  # [1, B * S]
    return out, lse.masked_fill(pads, float("inf"))


def varlen_attention_ref(q, k, v, cu_seqlens, sm_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The twin of the packed forward: `attention_ref` over each segment on its own. Returns (out [1, H, T, D],
    lse float32 [H, T])."""
    out = torch.zeros_like(q)  # [1, H, T, D]
    lse = torch.full((q.shape[1], q.shape[2]), float("inf"), device=q.device)  # [H, T]
    bounds = cu_seqlens.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi > lo:
            valid = torch.ones(1, hi - lo, dtype=torch.bool, device=q.device)
            part, part_lse = attention_ref(
                q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], valid, 0, sm_scale, with_lse=True
            )
            out[:, :, lo:hi], lse[:, lo:hi] = part, part_lse[0]
    return out, lse


def flash_backward_runs(q: torch.Tensor) -> bool:
    """Whether flash attention's backward takes these queries (CUDA bf16 / fp16, head dim a multiple of 8 up to 256)."""
    dim = q.shape[-1]
    return (
        q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and dim % 8 == 0
        and dim <= 256
        and hasattr(torch.ops.aten, "_flash_attention_backward")
    )


def _flash_backward(d_out, q, k, v, out, lse, cu, longest: int, sm_scale: float):
    """flash attention's varlen backward over [rows, H, D] views of the [B, H, S, D] tensors; grads back in the
    inputs' layout."""

    def rows(t):  # [B, H, S, D] -> [B * S, H, D]
        return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])

    def back(grad, like):  # [B * S, H, D] -> [B, H, S, D]
        return grad.view(like.shape[0], like.shape[2], like.shape[1], like.shape[3]).transpose(1, 2)

    rng = torch.zeros(2, dtype=torch.uint64, device=q.device)  # philox state: unused at dropout 0
    unused = torch.empty(0, device=q.device)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        rows(d_out), rows(q), rows(k), rows(v), rows(out), lse, cu, cu, longest, longest, 0.0, True, rng, unused,
        scale=sm_scale,
    )  # fmt: skip
    return back(dq, q), back(dk, k), back(dv, v)


def _twin_backward(d_out, q, k, v, out, lse, layout: _Layout, sm_scale: float):
    """The flash backward's formulas in float64 over chunks of REF_QUERY_CHUNK queries (module docstring)."""
    bsz, heads, seq, dim = q.shape
    n_rep = heads // k.shape[1]
    k64 = k.double().repeat_interleave(n_rep, 1)  # [B, H, S, D]
    v64 = v.double().repeat_interleave(n_rep, 1)
    lse3 = lse.view(heads, bsz, seq).transpose(0, 1).double()  # [B, H, S]
    delta = (d_out.double() * out.double()).sum(-1)  # [B, H, S]: rowsum(dO O)
    dk, dv, dq = torch.zeros_like(k64), torch.zeros_like(v64), []
    for lo in range(0, seq, REF_QUERY_CHUNK):
        hi = min(lo + REF_QUERY_CHUNK, seq)
        qc, doc = q[:, :, lo:hi].double(), d_out[:, :, lo:hi].double()  # [B, H, c, D]
        scores = qc @ k64.transpose(-1, -2) * sm_scale  # [B, H, c, S]
        p = torch.where(layout.allowed(lo, hi, seq), (scores - lse3[:, :, lo:hi, None]).exp(), 0.0)
        dv += p.transpose(-1, -2) @ doc
        ds = p * (doc @ v64.transpose(-1, -2) - delta[:, :, lo:hi, None])  # [B, H, c, S]
        dq.append(ds @ k64 * sm_scale)
        dk += ds.transpose(-1, -2) @ qc * sm_scale
    grouped = (bsz, k.shape[1], n_rep, seq, dim)
    dq = torch.cat(dq, dim=2).to(q.dtype)
    return dq, dk.view(grouped).sum(2).to(k.dtype), dv.view(grouped).sum(2).to(v.dtype)
