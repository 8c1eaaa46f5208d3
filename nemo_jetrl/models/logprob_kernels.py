"""Triton kernels of the fused token logprob (`models/logprobs.py` holds the contract and the pure-torch twin).

Forward: one program per row, two passes over the vocabulary in LOGPROB_BLOCK-wide steps (max, then the sum of
exp(x - max) per lane, lanes summed once): lse [T] and logp = x[token] - lse, float32, from logits in their own
dtype (bf16 read in place, never copied to float32). Backward: one program per (row, vocabulary block) writes
`(onehot - exp(x - lse)) * grad` (times 1/temperature) in the logits' dtype. With temperature != 1 the logits are
multiplied by float32(1 / temperature) (the twin divides; the two differ in the last bit). Imported on CUDA only
(or under Triton's interpreter in tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.kernels.device import on_device

LOGPROB_BLOCK = 4096  # vocabulary entries per step of a row's reduction (fixed: the reduction order never changes)
GRAD_BLOCK = 4096  # vocabulary entries per backward program


@triton.jit
def load_scaled(base, cols, V, inv_t, SCALE: tl.constexpr):
    """Logits base[cols] in float32 (-inf past V), times float32(1 / temperature) with SCALE."""
    x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    if SCALE:
        x = x * inv_t
    return x


@triton.jit
def row_max(base, V, inv_t, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """The max of a row's scaled logits: per lane over BLOCK-wide steps, then over the lanes."""
    lanes = tl.arange(0, BLOCK)
    mvec = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for c0 in range(0, V, BLOCK):
        mvec = tl.maximum(mvec, load_scaled(base, c0 + lanes, V, inv_t, SCALE))
    return tl.max(mvec, axis=0)


@triton.jit
def _logprob_fwd_kernel(
    x_ptr, tok_ptr, logp_ptr, lse_ptr, V, stride_r, inv_t, SCALE: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_r
    lanes = tl.arange(0, BLOCK)
    m = row_max(base, V, inv_t, SCALE, BLOCK)
    svec = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, V, BLOCK):
        svec += tl.exp(load_scaled(base, c0 + lanes, V, inv_t, SCALE) - m)
    lse = m + tl.log(tl.sum(svec, axis=0))
    tok = tl.load(tok_ptr + row)
    xt = tl.load(base + tok).to(tl.float32)
    if SCALE:
        xt = xt * inv_t
    tl.store(logp_ptr + row, xt - lse)
    tl.store(lse_ptr + row, lse)


@triton.jit
def _logprob_bwd_kernel(
    x_ptr, tok_ptr, lse_ptr, g_ptr, dx_ptr, V, stride_r, stride_dr, inv_t, SCALE: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < V
    x = tl.load(x_ptr + row * stride_r + cols, mask=inside, other=0.0).to(tl.float32)
    if SCALE:
        x = x * inv_t
    p = tl.exp(x - tl.load(lse_ptr + row))
    tok = tl.load(tok_ptr + row)
    d = (tl.where(cols == tok, 1.0, 0.0) - p) * tl.load(g_ptr + row)
    if SCALE:
        d = d * inv_t
    tl.store(dx_ptr + row * stride_dr + cols, d.to(dx_ptr.dtype.element_ty), mask=inside)


def _inverse(temperature: float) -> tuple[float, bool]:
    return float(torch.tensor(1.0 / temperature, dtype=torch.float32)), temperature != 1.0


def logprob_forward(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, V] (V contiguous), tokens [T] -> (logp [T], lse [T]) float32."""
    rows, vocab = logits.shape
    logp = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logp)
    if rows:
        inv_t, scale = _inverse(temperature)
        with on_device(logits):
            _logprob_fwd_kernel[(rows,)](
                logits, tokens, logp, lse, vocab, logits.stride(0), inv_t, SCALE=scale, BLOCK=LOGPROB_BLOCK,
                num_warps=8,
            )  # fmt: skip
    return logp, lse


def logprob_backward(
    logits: torch.Tensor, tokens: torch.Tensor, lse: torch.Tensor, grad_logp: torch.Tensor, temperature: float
) -> torch.Tensor:
    """d logp / d logits [T, V] in the logits' dtype, for grad_logp [T] float32."""
    rows, vocab = logits.shape
    grad = torch.empty_like(logits)
    if rows:
        inv_t, scale = _inverse(temperature)
        with on_device(logits):
            _logprob_bwd_kernel[(rows, triton.cdiv(vocab, GRAD_BLOCK))](
                logits, tokens, lse, grad_logp.float(), grad, vocab, logits.stride(0), grad.stride(0), inv_t,
                SCALE=scale, BLOCK=GRAD_BLOCK, num_warps=8,
            )  # fmt: skip
    return grad
