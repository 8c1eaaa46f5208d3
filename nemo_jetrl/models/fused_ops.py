"""Fused rollout kernels for the decoder's elementwise glue: residual add + RMSNorm, q/k-norm + RoPE, SiLU * up.

A decode step of an 8B model is ~50 small kernels per layer in eager PyTorch (HF RMSNorm alone is 6, RoPE 4 per
tensor), each a launch even inside a CUDA graph (docs/performance_history.md, "What each pass changed"). These
Triton kernels do each group in one
pass with the SAME per-op roundings as the HF modules they replace (every intermediate rounded to the dtype
PyTorch's type promotion gives it), so the only differences from the eager path are the FP32 reduction order
of the RMSNorm variance and the `rsqrt`/`exp` implementations (last-bit effects; tests bound them).

Twins: `add_rms_norm_ref`, `qk_norm_rope_ref`, `silu_mul_ref` are the eager HF formulas. `decoder_forward` uses
the kernels only where the caller asks for them (the rollout engine's fused decode path on CUDA); the trainer's
forward and the CPU path stay the eager twins. Runs on CPU under `TRITON_INTERPRET=1` (tests).
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.kernels.triton_quant import quant_vector_groups

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# HF norms computing exactly `rms_norm_ref` (weight * normalized, eps in `variance_epsilon`).
RMS_NORM_CLASSES = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm"})
# Activation modules whose forward is `F.silu` (transformers 5 wraps it as `SiLUActivation`, not `nn.SiLU`).
SILU_CLASSES = frozenset({"SiLU", "SiLUActivation"})


def _promote(*dtypes: torch.dtype) -> torch.dtype:
    return functools.reduce(torch.promote_types, dtypes)


# ----------------------------------------------------------------------------------------------------------------
# eager twins (the HF modules' math)
# ----------------------------------------------------------------------------------------------------------------
def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama/Qwen RMSNorm: weight * (x_fp32 * rsqrt(mean(x_fp32^2) + eps)).to(x.dtype)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)); x + delta is skipped when delta is None."""
    if delta is not None:
        x = x + delta
    return x, rms_norm_ref(x, weight, eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qk_norm_rope_ref(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """x [B, S, H, D] -> optional per-head RMSNorm (Qwen3 q/k-norm), then RoPE with cos/sin [B, S, D]."""
    if weight is not None:
        x = rms_norm_ref(x, weight, eps)
    cos, sin = cos[:, :, None], sin[:, :, None]
    return (x * cos) + (rotate_half(x) * sin)


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


# ----------------------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def _round(x, DT: tl.constexpr):
    """fp32 x rounded to DT (nearest even) and widened back to fp32, as one eager PyTorch op's output would be.

    Written on the bits for bf16: the compiler may fold a `.to(bf16).to(fp32)` round trip into nothing (and the
    CPU interpreter truncates), which would skip the rounding the eager ops do between steps. Stores of bf16
    values go through it too, so the final narrowing cast is exact."""
    if DT == tl.float32:
        return x
    elif DT == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def _mul_rn(a, b, HW: tl.constexpr):
    """fp32 a * b rounded on its own (PTX `mul.rn`, which the assembler never contracts into a later FMA). A plain
    product feeding the fused FP8 quantizer's division may be contracted there, so the fused kernel's FP8 bits
    would differ from quantizing the stored output; the CPU interpreter (HW false) has no inline assembly and no
    contraction."""
    if HW:
        return tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=r,r,r", [a.to(tl.float32), b.to(tl.float32)], dtype=tl.float32,
            is_pure=True, pack=1,
        )  # fmt: skip
    else:
        return a * b


@triton.jit
def _store_out(out_ptr, q_ptr, s_ptr, y, row, cols, ok, N, stride_sg, group0,
               OUT: tl.constexpr, QUANT: tl.constexpr, QB: tl.constexpr, POW2: tl.constexpr, BLOCK: tl.constexpr,
               Q_RUN: tl.constexpr = 16):  # fmt: skip
    # y [BLOCK] fp32 (already rounded to OUT) at columns `cols` of row `row` of a [R, N] output: stored in OUT, or
    # (QUANT) as e4m3 [R, N] + fp32 scales (column-major [R, N / QB], group index group0 + g) like `act_quant`.
    # Q_RUN: the e4m3 store's columns are seen contiguous in runs of Q_RUN only (`_norm_store_run`).
    if QUANT:
        q, scale = quant_vector_groups(y, BLOCK, QB, POW2)
        tl.store(q_ptr + row * N + (cols // Q_RUN) * Q_RUN + cols % Q_RUN, q, mask=ok)
        groups = group0 + tl.arange(0, BLOCK // QB)
        tl.store(s_ptr + row + groups * stride_sg, scale, mask=groups * QB < N)
    else:
        tl.store(out_ptr + row * N + cols, y.to(OUT), mask=ok)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, d_ptr, w_ptr, res_ptr, out_ptr, q_ptr, s_ptr, N, stride_x, stride_d, stride_sg, eps,
    HAS_DELTA: tl.constexpr, RES: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
    QUANT: tl.constexpr = False, QB: tl.constexpr = 128, POW2: tl.constexpr = False, HW: tl.constexpr = False,
    Q_RUN: tl.constexpr = 16,
):  # fmt: skip
    # One program per row: res = x + d (rounded to RES), out = w * (res * rsqrt(mean(res^2) + eps)).to(RES) -> OUT
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
        x = _round(x + d, RES)
        tl.store(res_ptr + row * N + cols, x.to(RES), mask=ok)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    h = _round(_mul_rn(x, rstd, HW), RES)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    y = tl.where(ok, _round(_mul_rn(w, h, HW), OUT), 0.0)
    _store_out(out_ptr, q_ptr, s_ptr, y, row, cols, ok, N, stride_sg, 0, OUT, QUANT, QB, POW2, BLOCK, Q_RUN)


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, H, stride_xt, stride_xh, stride_ct, eps,
    HAS_NORM: tl.constexpr, XD: tl.constexpr, ND: tl.constexpr, RD: tl.constexpr,
    D: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    # One program per token t: x [H, D] (row t of [T, H, D]) -> out [H, D]; the rotated half is loaded directly.
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, D)
    half: tl.constexpr = D // 2
    rot_cols = (cols + half) % D  # rotate_half(x)[j] = -x[j + D/2] (j < D/2), x[j - D/2] (j >= D/2)
    sign = tl.where(cols < half, -1.0, 1.0)
    ok = (heads < H)[:, None]
    base = x_ptr + t * stride_xt + heads[:, None] * stride_xh
    x = tl.load(base + cols[None, :], mask=ok, other=0.0).to(tl.float32)  # x: [BH, D]
    xr = tl.load(base + rot_cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]  # [BH, 1]
        w = tl.load(w_ptr + cols).to(tl.float32)[None, :]
        wr = tl.load(w_ptr + rot_cols).to(tl.float32)[None, :]
        x = _round(w * _round(x * rstd, XD), ND)
        xr = _round(wr * _round(xr * rstd, XD), ND)
    cos = tl.load(cos_ptr + t * stride_ct + cols).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + t * stride_ct + cols).to(tl.float32)[None, :]
    a = _round(x * cos, RD)
    b = _round(sign[None, :] * xr * sin, RD)
    out_ptrs = out_ptr + t * H * D + heads[:, None] * D + cols[None, :]
    tl.store(out_ptrs, _round(a + b, RD).to(RD), mask=ok)


@triton.jit
def _silu(g, G: tl.constexpr):
    """silu(g) of fp32 g rounded to G: F.silu's value, which SiLU*up multiplies (and its backward reuses)."""
    return _round(g / (1.0 + tl.exp(-g)), G)


@triton.jit
def _silu_mul_kernel(
    g_ptr, u_ptr, out_ptr, q_ptr, s_ptr, N, stride_g, stride_u, stride_sg,
    G: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
    QUANT: tl.constexpr = False, QB: tl.constexpr = 128, POW2: tl.constexpr = False, HW: tl.constexpr = False,
):  # fmt: skip
    # out [M, N] (contiguous) = silu(g) (rounded to g's dtype) * u (rounded to OUT); g/u [M, N] with row strides
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(g_ptr + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
    s = _silu(g, G)
    y = tl.where(ok, _round(_mul_rn(s, u, HW), OUT), 0.0)
    group0 = tl.program_id(1) * (BLOCK // QB)
    _store_out(out_ptr, q_ptr, s_ptr, y, row, cols, ok, N, stride_sg, group0, OUT, QUANT, QB, POW2, BLOCK)


# ----------------------------------------------------------------------------------------------------------------
# wrappers
# ----------------------------------------------------------------------------------------------------------------
def _hw() -> bool:
    """A GPU compiles the kernels (not the CPU interpreter of TRITON_INTERPRET=1): inline assembly is available."""
    return os.environ.get("TRITON_INTERPRET") != "1"


def normed_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype the glue kernels return for these input dtypes (PyTorch's type promotion, as eager)."""
    return _promote(*dtypes)


def fused_ops_supported(x: torch.Tensor) -> bool:
    """Dtypes the kernels handle (the tensor's device must run Triton: CUDA, or CPU under the interpreter)."""
    return x.dtype in _TL_DTYPES


def fusable_rms_norm(norm: torch.nn.Module | None) -> bool:
    """Whether `norm` is a HF RMSNorm whose math `rms_norm_ref` reproduces."""
    return norm is not None and type(norm).__name__ in RMS_NORM_CLASSES and hasattr(norm, "variance_epsilon")


def is_silu(act: torch.nn.Module) -> bool:
    """Whether the MLP activation `act` is SiLU (what `silu_mul` fuses with the up projection)."""
    return type(act).__name__ in SILU_CLASSES


def qk_norm_rope_supported(x: torch.Tensor, norm: torch.nn.Module | None) -> bool:
    """x [B, S, H, D] with a power-of-two head dim, and no norm or a fusable one."""
    dim = x.shape[-1]
    return fused_ops_supported(x) and dim >= 2 and dim & (dim - 1) == 0 and (norm is None or fusable_rms_norm(norm))


def _outputs(shape: tuple[int, ...], out_dtype: torch.dtype, quant: tuple[int, bool] | None, device):
    """(out, q, scale) of a glue kernel: an empty `shape` output in `out_dtype` (q, scale alias it, unused), or
    with `quant` = (block, pow2) the e4m3 [R, N] data and fp32 [R, N / block] column-major scales, the layout
    `act_quant` returns (out aliases the data, unused)."""
    if quant is None:
        out = torch.empty(shape, dtype=out_dtype, device=device)
        return out, out, out
    rows, n = math.prod(shape[:-1]), shape[-1]
    if n % quant[0]:
        raise ValueError(f"fused FP8 output: the width {n} is not a multiple of the quantization block {quant[0]}")
    data = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=device)
    return data, data, torch.empty((n // quant[0], rows), dtype=torch.float32, device=device).t()


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused `add_rms_norm_ref`: x, delta [..., N] -> (residual [..., N], normed [..., N])."""
    return _add_rms_norm(x, delta, weight, eps, None)


def add_rms_norm_fp8(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, block: int, pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`add_rms_norm` with the normed output quantized in the same kernel: (residual [..., N], e4m3 [R, N],
    scales [R, N / block]), bitwise `act_quant(normed.reshape(R, N), block, pow2)`."""
    return _add_rms_norm(x, delta, weight, eps, (block, pow2))


def _add_rms_norm(x, delta, weight, eps, quant: tuple[int, bool] | None):
    n = x.shape[-1]
    res_dtype = _promote(x.dtype, delta.dtype) if delta is not None else x.dtype
    out_dtype = _promote(weight.dtype, res_dtype)
    x2 = x.reshape(-1, n)
    d2 = delta.reshape(-1, n) if delta is not None else x2
    if x2.stride(-1) != 1 or d2.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("add_rms_norm: the last dim of x, delta and weight must be contiguous")
    res = torch.empty(x2.shape, dtype=res_dtype, device=x.device) if delta is not None else x2
    out, q, scale = _outputs(x2.shape, out_dtype, quant, x.device)
    block = max(triton.next_power_of_2(n), quant[0] if quant else 1)
    if x2.shape[0]:
        _add_rms_norm_kernel[(x2.shape[0],)](
            x2, d2, weight, res, out, q, scale, n, x2.stride(0), d2.stride(0), scale.stride(-1), eps,
            HAS_DELTA=delta is not None, RES=_TL_DTYPES[res_dtype], OUT=_TL_DTYPES[out_dtype], BLOCK=block,
            QUANT=quant is not None, QB=quant[0] if quant else 128, POW2=bool(quant and quant[1]), HW=_hw(),
            Q_RUN=_norm_store_run(x2, d2, weight), num_warps=row_warps(block),
        )  # fmt: skip
    res = res.view(*x.shape[:-1], n)
    return (res, q, scale) if quant is not None else (res, out.view(*x.shape[:-1], n))


def row_warps(block: int) -> int:
    """Warps of a norm kernel's program over one BLOCK-wide row: one per 256 columns, 1 to 16."""
    return min(16, max(1, block // 256))


def _norm_store_run(*inputs: torch.Tensor) -> int:
    """The columns of the norm's e4m3 store seen contiguous at a time: 16 bytes of its narrowest input (4 FP32 or 8
    BF16 values), the widest access of the plain kernel. The compiler gives the whole row the layout of its widest
    vector access; a 1-byte store seen contiguous takes up to 16 values a thread, and so another layout, hence
    another order of the sum of squares, than the plain kernel the trainer runs (tests/unit/models/
    test_glue_norm_compiled.py; on an H200, FP32 rows without a residual delta at every width and FP32 rows 5,120
    wide gave other bits, tests/gpu/test_fused_rollout_gpu.py)."""
    return 16 // min(t.element_size() for t in inputs)


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Fused `qk_norm_rope_ref`: x [B, S, H, D] (last dim contiguous), cos/sin [B, S, D] -> [B, S, H, D]."""
    bsz, seq, heads, dim = x.shape
    # token t = b * S + s sits at t * stride_t: needs B and S to collapse (a size-1 S may carry any stride)
    stride_t = x.stride(0) if seq == 1 else x.stride(1)
    collapses = bsz == 1 or x.stride(0) == seq * stride_t
    if x.stride(-1) != 1 or not collapses or cos.shape != (bsz, seq, dim) or dim % 2:
        raise ValueError(f"qk_norm_rope: unsupported x {tuple(x.shape)} / cos {tuple(cos.shape)}")
    cos, sin = cos.contiguous(), sin.contiguous()
    norm_dtype = _promote(weight.dtype, x.dtype) if weight is not None else x.dtype
    rope_dtype = _promote(norm_dtype, cos.dtype)
    out = torch.empty((bsz, seq, heads, dim), dtype=rope_dtype, device=x.device)
    tokens = bsz * seq
    if tokens:
        _qk_norm_rope_kernel[(tokens,)](
            x, weight if weight is not None else cos, cos, sin, out, heads, stride_t, x.stride(2), dim, eps,
            HAS_NORM=weight is not None, XD=_TL_DTYPES[x.dtype], ND=_TL_DTYPES[norm_dtype],
            RD=_TL_DTYPES[rope_dtype], D=dim, BLOCK_H=triton.next_power_of_2(heads), num_warps=4,
        )  # fmt: skip
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Fused `silu_mul_ref` for same-shape gate/up [..., F] whose rows are contiguous (e.g. the column views of
    one grouped gate/up GEMM output); returns a contiguous [..., F]."""
    return _silu_mul(gate, up, None)


def silu_mul_fp8(gate: torch.Tensor, up: torch.Tensor, block: int, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`silu_mul` quantized in the same kernel: (e4m3 [R, F], scales [R, F / block]), bitwise
    `act_quant(silu_mul(gate, up).reshape(R, F), block, pow2)`."""
    return _silu_mul(gate, up, (block, pow2))


def _silu_mul(gate, up, quant: tuple[int, bool] | None):
    if gate.shape != up.shape or gate.dim() == 0:
        raise ValueError(f"silu_mul: gate and up must have one shape, got {tuple(gate.shape)}, {tuple(up.shape)}")
    f = gate.shape[-1]
    g2, u2 = gate.reshape(-1, f), up.reshape(-1, f)  # views where the leading dims collapse, else copies
    if g2.stride(-1) != 1 or u2.stride(-1) != 1:
        raise ValueError("silu_mul: the last dim of gate and up must be contiguous")
    out_dtype = _promote(gate.dtype, up.dtype)
    out, q, scale = _outputs(gate.shape, out_dtype, quant, gate.device)
    block = min(2048, triton.next_power_of_2(max(f, 1)))
    block = max(block, quant[0]) if quant else block  # whole quantization groups per program (f % group == 0)
    if out.numel():
        _silu_mul_kernel[(g2.shape[0], triton.cdiv(f, block))](
            g2, u2, out, q, scale, f, g2.stride(0), u2.stride(0), scale.stride(-1),
            G=_TL_DTYPES[gate.dtype], OUT=_TL_DTYPES[out_dtype], BLOCK=block,
            QUANT=quant is not None, QB=quant[0] if quant else 128, POW2=bool(quant and quant[1]), HW=_hw(),
            num_warps=8 if block >= 1024 else 4,
        )  # fmt: skip
    return (q, scale) if quant is not None else out
