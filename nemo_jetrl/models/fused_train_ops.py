"""Differentiable fused glue for the trainer on CUDA: residual add + RMSNorm, q/k-norm + RoPE, SiLU * up.

Eager HF glue, each op a chain of fp32 temporaries, costs about as much as the decoder's GEMMs in a training step
(docs/performance_history.md, "Captured micro-batches and grouped FP8 GEMMs"). Here each group is one Triton
kernel forward and one backward:

- forward: the rollout's kernels from `fused_ops` (same per-op roundings as the HF modules), so the trainer's
  forward runs the very glue kernels the rollout's fused decode runs;
- backward: the analytic gradient of the same formulas, computed in FP32 per row with the eager backward's
  roundings where it has them (`dy * w` and `dy * cos` products in the output dtype, the weight gradient
  summed in FP32 and cast once):

    RMSNorm   y = w * bf16(x * r),  r = rsqrt(mean(x^2) + eps)
              dh = bf16(dy * w);    dx = dh * r - x * r^3 * mean(dh * x);    dw = sum_rows bf16(dy * bf16(x * r))
    RoPE      y = x * cos + rotate_half(x) * sin        dx = dy * cos + rotate_half^T(dy * sin)
    SiLU*up   y = bf16(silu(g)) * u                     dg = dy * u * sig * (1 + g * (1 - sig)),  du = dy * silu(g)

The RMSNorm statistics are recomputed in the backward from x (nothing extra saved). The weight-gradient
partials go to an FP32 workspace [programs, N] that torch sums (fixed order). Twins: autograd through
`fused_ops.*_ref` (tests: forward bitwise, gradients to a relative-error bound, GPU and Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_jetrl.models import fused_ops
from nemo_jetrl.models.fused_ops import _TL_DTYPES, _promote, _round, _silu, row_warps
from nemo_jetrl.utils.columns import adjacent_columns, column_buffer

# Programs per backward launch with a weight gradient (rows are spread over them; partials [programs, N]).
_DW_PROGRAMS = 512


@triton.jit
def _rms_norm_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, dres_ptr, dx_ptr, dw_ptr, R, N, stride_x, stride_dy, stride_dres, eps, RPP,
    HAS_DRES: tl.constexpr, XD: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # Program p owns rows [p * RPP, (p + 1) * RPP): dx [R, N] (x's dtype, contiguous) and dw partial row p [N] fp32.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(RPP):
        row = (pid * RPP + i).to(tl.int64)
        m = ok & (row < R)
        x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=m, other=0.0).to(tl.float32)
        r = tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        dw += _round(dy * _round(x * r, XD), OUT)
        dh = _round(dy * w, OUT)
        dx = dh * r - x * (r * r * r * tl.sum(dh * x, axis=0) / N)
        if HAS_DRES:
            dx += tl.load(dres_ptr + row * stride_dres + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(dx_ptr + row * N + cols, _round(dx, XD).to(XD), mask=m)
    tl.store(dw_ptr + pid * N + cols, dw, mask=ok)


@triton.jit
def _qk_norm_rope_bwd_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, dy_ptr, dx_ptr, dw_ptr, T, H, stride_xt, stride_xh, stride_ct,
    stride_dyt, stride_dyh, eps, TPP,
    HAS_NORM: tl.constexpr, XD: tl.constexpr, ND: tl.constexpr, RD: tl.constexpr, D: tl.constexpr,
    BLOCK_H: tl.constexpr,
):  # fmt: skip
    # Program p owns tokens [p * TPP, (p + 1) * TPP), each a [H, D] tile: dx [T, H, D] contiguous, dw partial [D].
    pid = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, D)
    half: tl.constexpr = D // 2
    rot_cols = (cols + half) % D
    sign = tl.where(cols < half, 1.0, -1.0)  # rotate_half^T(z)[j] = z[j + D/2] (j < D/2), -z[j - D/2] (j >= D/2)
    if HAS_NORM:
        w = tl.load(w_ptr + cols).to(tl.float32)[None, :]
    dw = tl.zeros((BLOCK_H, D), dtype=tl.float32)
    for i in range(TPP):
        t = (pid * TPP + i).to(tl.int64)
        ok = (heads < H)[:, None] & (t < T)
        dy_base = dy_ptr + t * stride_dyt + heads[:, None] * stride_dyh
        dy = tl.load(dy_base + cols[None, :], mask=ok, other=0.0).to(tl.float32)  # dy: [BH, D]
        dyr = tl.load(dy_base + rot_cols[None, :], mask=ok, other=0.0).to(tl.float32)
        cos = tl.load(cos_ptr + t * stride_ct + cols, mask=t < T, other=0.0).to(tl.float32)[None, :]
        sinr = tl.load(sin_ptr + t * stride_ct + rot_cols, mask=t < T, other=0.0).to(tl.float32)[None, :]
        dn = _round(_round(dy * cos, RD) + sign[None, :] * _round(dyr * sinr, RD), RD)  # grad of the RoPE input
        if HAS_NORM:
            x = tl.load(x_ptr + t * stride_xt + heads[:, None] * stride_xh + cols[None, :], mask=ok, other=0.0)
            x = x.to(tl.float32)
            r = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]  # [BH, 1]
            dw += _round(dn * _round(x * r, XD), ND)
            dh = _round(dn * w, ND)
            dn = dh * r - x * (r * r * r * tl.sum(dh * x, axis=1)[:, None] / D)
        tl.store(dx_ptr + t * H * D + heads[:, None] * D + cols[None, :], _round(dn, XD).to(XD), mask=ok)
    if HAS_NORM:
        tl.store(dw_ptr + pid * D + cols, tl.sum(dw, axis=0))


@triton.jit
def _silu_mul_bwd_kernel(
    g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, N, stride_g, stride_u, stride_dy, stride_d,
    G: tl.constexpr, U: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # dg, du [M, N] (row stride stride_d) from g, u, dy [M, N] with row strides (forward: out = bf16(silu(g)) * u).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(g_ptr + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=ok, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-g))
    s = _silu(g, G)  # the forward's silu(g), bit for bit: du = dy * s as autograd computes it
    ds = _round(dy * u, OUT)
    tl.store(dg_ptr + row * stride_d + cols, _round(ds * sig * (1.0 + g * (1.0 - sig)), G).to(G), mask=ok)
    tl.store(du_ptr + row * stride_d + cols, _round(dy * s, OUT).to(U), mask=ok)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., N] as [R, N] with a contiguous last dim (a view where possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _per_program(items: int) -> tuple[int, int]:
    """(programs, items per program) spreading `items` over at most _DW_PROGRAMS programs."""
    per = max(1, triton.cdiv(items, _DW_PROGRAMS))
    return triton.cdiv(items, per), per


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, delta, weight, eps):
        # outputs (x + delta, normed); with delta None the residual output is x itself (a view of it through this
        # function), so its gradient joins the norm's in the kernel, rounded once, as with a delta
        res, out = fused_ops.add_rms_norm(x, delta, weight, eps)
        ctx.save_for_backward(res, weight)
        ctx.eps, ctx.has_delta, ctx.dtypes = eps, delta is not None, (x.dtype, getattr(delta, "dtype", None))
        return res, out

    @staticmethod
    def backward(ctx, d_res, d_out):
        res, weight = ctx.saved_tensors
        n = res.shape[-1]
        x2, dy2 = _rows(res), _rows(d_out)
        dres2 = _rows(d_res) if d_res is not None else None
        programs, rpp = _per_program(x2.shape[0])
        dx = torch.empty(x2.shape, dtype=res.dtype, device=res.device)
        dw = torch.empty((programs, n), dtype=torch.float32, device=res.device)
        if x2.shape[0]:
            block = triton.next_power_of_2(n)
            _rms_norm_bwd_kernel[(programs,)](
                x2, weight, dy2, dres2 if dres2 is not None else dy2, dx, dw, x2.shape[0], n, x2.stride(0),
                dy2.stride(0), (dres2 if dres2 is not None else dy2).stride(0), ctx.eps, rpp,
                HAS_DRES=dres2 is not None, XD=_TL_DTYPES[res.dtype], OUT=_TL_DTYPES[d_out.dtype], BLOCK=block,
                num_warps=row_warps(block),
            )  # fmt: skip
        dx = dx.view(res.shape)
        x_dtype, delta_dtype = ctx.dtypes
        d_delta = dx.to(delta_dtype) if ctx.has_delta else None
        return dx.to(x_dtype), d_delta, dw.sum(0).to(weight.dtype), None


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, cos, sin):
        out = fused_ops.qk_norm_rope(x, weight, eps, cos, sin)
        # q / k as column views of the grouped q/k/v GEMM's output would keep all of it (v's columns too) alive to the
        # backward: a compact copy keeps only their own (under autograd; a separate projection's output is no copy)
        kept = x.contiguous() if any(ctx.needs_input_grad[:2]) else x
        ctx.save_for_backward(kept, weight, cos.contiguous(), sin.contiguous())
        ctx.eps, ctx.out_dtype = eps, out.dtype
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight, cos, sin = ctx.saved_tensors
        bsz, seq, heads, dim = x.shape
        if dy.stride(-1) != 1 or not (bsz == 1 or dy.stride(0) == seq * dy.stride(1)):
            dy = dy.contiguous()
        tokens = bsz * seq
        programs, tpp = _per_program(tokens)
        has_norm = weight is not None
        norm_dtype = _promote(weight.dtype, x.dtype) if has_norm else x.dtype
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        dw = torch.empty((programs, dim), dtype=torch.float32, device=x.device)
        stride_xt = x.stride(0) if seq == 1 else x.stride(1)
        stride_dyt = dy.stride(0) if seq == 1 else dy.stride(1)
        if tokens:
            _qk_norm_rope_bwd_kernel[(programs,)](
                x, weight if has_norm else cos, cos, sin, dy, dx, dw, tokens, heads, stride_xt, x.stride(2),
                dim, stride_dyt, dy.stride(2), ctx.eps, tpp,
                HAS_NORM=has_norm, XD=_TL_DTYPES[x.dtype], ND=_TL_DTYPES[norm_dtype],
                RD=_TL_DTYPES[ctx.out_dtype], D=dim, BLOCK_H=triton.next_power_of_2(heads), num_warps=4,
            )  # fmt: skip
        d_weight = dw.sum(0).to(weight.dtype) if has_norm else None
        return dx, d_weight, None, None, None


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return fused_ops.silu_mul(gate, up)

    @staticmethod
    def backward(ctx, dy):
        return silu_mul_backward(*ctx.saved_tensors, dy)


def silu_mul_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d gate, d up) [..., F] of y = silu(gate) * up from dy [..., F]; gate / up as the grouped GEMM's adjacent
    column views get their gradients side by side in one [..., 2F] buffer too."""
    f = gate.shape[-1]
    g2, u2, dy2 = _rows(gate), _rows(up), _rows(dy)
    if adjacent_columns((gate, up)):  # the grouped gate/up's column views: d(gate), d(up) side by side too
        dg, du = column_buffer(gate, (f, f))  # views [..., F] of one [..., 2F] (join_columns: no copy)
    else:
        dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        du = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    block = min(2048, triton.next_power_of_2(max(f, 1)))
    if dg.numel():
        _silu_mul_bwd_kernel[(g2.shape[0], triton.cdiv(f, block))](
            g2, u2, dy2, dg, du, f, g2.stride(0), u2.stride(0), dy2.stride(0), dg.stride(-2) if dg.dim() > 1 else f,
            G=_TL_DTYPES[gate.dtype], U=_TL_DTYPES[up.dtype], OUT=_TL_DTYPES[dy.dtype], BLOCK=block,
            num_warps=8 if block >= 1024 else 4,
        )  # fmt: skip
    return dg, du


class SiluMulInput:
    """silu(gate) * up as the input of an FP8 linear that quantizes it inside its own autograd function
    (`precision.op_input_linear`: the BF16 product is gone before the linear's GEMM runs)."""

    @staticmethod
    def forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return fused_ops.silu_mul(gate, up)

    @staticmethod
    def backward(inputs: tuple[torch.Tensor, torch.Tensor], dx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return silu_mul_backward(*inputs, dx)

    @staticmethod
    def apply(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate, up)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable `fused_ops.add_rms_norm`: x, delta [..., N] -> (x + delta, rms_norm(x + delta)); delta None:
    (x, rms_norm(x)), the residual's gradient summed with the norm's in the backward kernel as with a delta (a
    checkpointed layer takes the residual sum made before it: models/recompute.py)."""
    return _AddRMSNorm.apply(x, delta, weight, eps)


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Differentiable `fused_ops.qk_norm_rope`: x [B, S, H, D], cos/sin [B, S, D] (no gradient) -> [B, S, H, D]."""
    return _QKNormRope.apply(x, weight, eps, cos, sin)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Differentiable `fused_ops.silu_mul`: silu(gate) * up for same-shape [..., F] tensors."""
    return _SiluMul.apply(gate, up)
