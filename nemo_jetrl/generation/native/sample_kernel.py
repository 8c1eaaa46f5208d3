"""Fused sampling on CUDA: the next token by inverse CDF AND its logprob in one Triton kernel (no top-k / top-p).

`sampler.sample` is the contract and its torch path the twin. One program per row, the logits read in their own
dtype (bf16 in place, no float32 [B, V] copy), two passes over the vocabulary in `LOGPROB_BLOCK`-wide steps and a
third over one step: (1) the max m of x / T; (2) per lane, the float32 sums of exp(x / T - m) that
`logprob_kernels` sums (so the logprob is bitwise `token_logprobs`'s fused kernel's), and each step's float64
weight; (3) the step where the running float64 weight first exceeds u * total (u the row's uniform,
`sampler.uniforms`), and in it the first token whose running weight does. The twin normalises the probabilities and
sums them in float64 in another order: the two pick different tokens only where u * total falls within a few
float64 ulps of a boundary. Where rounding leaves u * total at or above the last sum, the last token of non-zero
weight is taken (the twin clamps to V - 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_jetrl.models.logprob_kernels import LOGPROB_BLOCK, _inverse, load_scaled, row_max
from nemo_jetrl.precision.kernels.device import on_device


@triton.jit
def _sample_kernel(
    x_ptr, u_ptr, sums_ptr, tok_ptr, logp_ptr, V, stride_r, inv_t,
    SCALE: tl.constexpr, BLOCK: tl.constexpr, NCH: tl.constexpr, NCH_P2: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_r
    lanes = tl.arange(0, BLOCK)
    m = row_max(base, V, inv_t, SCALE, BLOCK)
    svec = tl.zeros([BLOCK], dtype=tl.float32)  # the logprob kernel's lanes, summed in its order
    for c0 in range(0, V, BLOCK):
        e = tl.exp(load_scaled(base, c0 + lanes, V, inv_t, SCALE) - m)
        svec += e
        tl.store(sums_ptr + row * NCH + c0 // BLOCK, tl.sum(e.to(tl.float64), axis=0))  # step c0's float64 weight
    lse = m + tl.log(tl.sum(svec, axis=0))
    # the step whose running float64 weight first exceeds u * total, then the token inside it
    steps = tl.arange(0, NCH_P2)
    sums = tl.load(sums_ptr + row * NCH + steps, mask=steps < NCH, other=0.0)  # [NCH_P2] float64
    target = tl.load(u_ptr + row) * tl.sum(sums, axis=0)
    run = tl.cumsum(sums, axis=0)
    j = tl.min(tl.where((run > target) & (steps < NCH), steps, NCH), axis=0)
    at_end = j == NCH  # rounding left u * total at the end: the last step of non-zero weight, its last such token
    j = tl.where(at_end, tl.max(tl.where(sums > 0, steps, 0), axis=0), j)
    target = tl.where(at_end, float("inf"), target)
    before = tl.sum(tl.where(steps < j, sums, 0.0), axis=0)
    cols = j * BLOCK + lanes
    w = tl.exp(load_scaled(base, cols, V, inv_t, SCALE) - m).to(tl.float64)
    cum = before + tl.cumsum(w, axis=0)
    first = tl.min(tl.where((cum > target) & (cols < V), cols, V), axis=0)
    last = tl.max(tl.where(w > 0, cols, -1), axis=0)
    tok = tl.where(first < V, first, last).to(tl.int64)
    tl.store(tok_ptr + row, tok)
    xt = tl.load(base + tok).to(tl.float32)
    if SCALE:
        xt = xt * inv_t
    tl.store(logp_ptr + row, xt - lse)


def sample_fused(logits: torch.Tensor, u: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] (any float dtype), u [B] float64 in [0, 1) -> (tokens [B] long, logprobs [B] float32)."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    steps = triton.cdiv(vocab, LOGPROB_BLOCK)
    sums = torch.empty(rows, steps, dtype=torch.float64, device=logits.device)  # [B, steps] each step's weight
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    logp = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        inv_t, scale = _inverse(temperature)
        with on_device(logits):
            _sample_kernel[(rows,)](
                logits, u.to(torch.float64).contiguous(), sums, tokens, logp, vocab, logits.stride(0), inv_t,
                SCALE=scale, BLOCK=LOGPROB_BLOCK, NCH=steps, NCH_P2=triton.next_power_of_2(steps), num_warps=8,
            )  # fmt: skip
    return tokens, logp
