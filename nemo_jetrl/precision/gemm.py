"""Blockwise FP8 GEMMs: `torch.nn.functional.scaled_mm` on Hopper (sm90), exact emulation elsewhere.

One entry for the three training GEMMs and the rollout:

    fp8_blockwise_mm(x_fp8 [M, K], x_scale [M, K/128], w_fp8 [N, K], w_scale, out_dtype) -> [M, N] = X @ W^T

with X in 1x128 groups along K and W in 128x128 tiles (`w_blocks="128x128"`, scale [N/128, K/128]) or in 1x128
groups along K (`w_blocks="1x128"`, scale [N, K/128]; the exact DeepSeek/Jet-RL WGrad layout).

    FProp  Y [M, N]  = Q(X) [M, K]         @ Q(W)^T                     (W tiles)
    DGrad  dX [M, K] = Q(dY) [M, N]        @ Q(W) = Q(W)^T with tiles transposed
    WGrad  dW [N, K] = Q(dY^T) [N, M]      @ Q(X^T)^T    (groups of 128 along the tokens M; `fp8_wgrad_mm`)

The emulation dequantizes the same FP8 bits with the same scales, multiplies in FP32, then casts. The backend is
chosen once per device by `gemm_backend(device)` (a probe checks scaled_mm's layouts against the emulation). On
Hopper, products with at most `SMALL_M_MAX` rows (the rollout's decode batches) may go to a split-K Triton kernel
(`kernels/triton_gemm.py`): each such shape is timed once against cuBLAS and the faster is kept (which wins where:
docs/performance_history.md, "Decode GEMMs"). `backend="batch_invariant"` (the exact mode)
takes `precision.batch_invariant.fp8_mm` for every M: one K order whatever the shape, twin included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from nemo_jetrl.precision import deep_gemm_adapter
from nemo_jetrl.precision.quant import act_dequant, act_quant, act_quant_t, weight_dequant, weight_quant

logger = logging.getLogger(__name__)

GemmBackend = Literal["scaled_mm", "emulated"]
Backend = Literal["auto", "deep_gemm", "scaled_mm", "scaled_mm_padded", "triton", "emulated", "batch_invariant"]
Library = Literal["scaled_mm", "deep_gemm"]  # the library GEMM of "auto" on sm90 (cuBLAS, or DeepGEMM)
WBlocks = Literal["128x128", "1x128"]
_FP8 = torch.float8_e4m3fn
# Most rows for which the Triton split-K kernel is a candidate (timed against scaled_mm per shape; decode batches).
SMALL_M_MAX = 256
# Fewest rows backend "scaled_mm_padded" (the matched kernels' pin) hands cuBLAS: below it cuBLAS may pick another
# kernel, with another summation order, than at a trainer micro-batch's rows (docs/mismatch.md).
PADDED_MIN_ROWS = 64


@dataclass(frozen=True)
class ScaledMMCaps:
    """What the probe found `scaled_mm` accepts on one device."""

    pad_tile_scale_rows: bool  # 128x128 scales: rows padded to a multiple of 4 blocks (torch >= 2.10 layout)
    fp32_out: bool  # FP32 output accepted (used for WGrad into FP32 master grads)
    groups_1x128_b: bool  # 1x128 x 1x128 accepted (the exact Jet-RL WGrad layout)


def gemm_backend(device: torch.device | str) -> GemmBackend:
    """'scaled_mm' on an sm90 GPU whose torch has blockwise scaled_mm (checked once), else 'emulated'."""
    return "scaled_mm" if scaled_mm_caps(torch.device(device)) is not None else "emulated"


def scaled_mm_caps(device: torch.device) -> ScaledMMCaps | None:
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _probe_scaled_mm(index)


def fp8_blockwise_mm(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    bias: torch.Tensor | None = None,
    w_blocks: WBlocks = "128x128",
    block: int = 128,
    backend: Backend = "auto",
    w_dequant: torch.Tensor | None = None,
) -> torch.Tensor:
    """Y [M, N] = dequant(x_fp8, x_scale) @ dequant(w_fp8, w_scale)^T (+ bias), in `out_dtype`.

    `w_dequant` ([N, K] fp32, optional) is a cached `dequant(w_fp8, w_scale)` the emulation may reuse. backend
    "auto": on sm90, for <= SMALL_M_MAX rows with 128x128 weight tiles, the faster of the Triton kernel and
    scaled_mm for the shape (timed once); scaled_mm for larger products; the emulation off sm90. "deep_gemm": "auto"
    with DeepGEMM in cuBLAS's place for the products it takes (`deep_gemm_adapter.fits`; same operands, its own FP32
    summation order), "auto" itself where it cannot run. "batch_invariant": the exact mode's GEMM (Triton on CUDA,
    the block-exact float64 twin elsewhere; 128x128 weight tiles). "scaled_mm_padded": "scaled_mm" over at least
    PADDED_MIN_ROWS rows (rows added, their outputs sliced off), what `matched_kernels` runs at every M.
    """
    _check_operands(x_fp8, x_scale, w_fp8, w_scale, w_blocks, block)
    if backend == "batch_invariant":
        if w_blocks != "128x128" or block != 128:
            raise ValueError("fp8_blockwise_mm: backend='batch_invariant' needs 128x128 weight tiles")
        from nemo_jetrl.precision import batch_invariant

        with no_autocast(x_fp8.device.type):
            return batch_invariant.fp8_mm(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias)
    if w_dequant is not None and (w_dequant.shape != w_fp8.shape or w_dequant.dtype != torch.float32):
        raise ValueError(
            f"fp8_blockwise_mm: w_dequant must be float32 {tuple(w_fp8.shape)}, got {w_dequant.dtype} "
            f"{tuple(w_dequant.shape)}"
        )
    library: Library = "scaled_mm"
    min_rows = 0  # fewest rows handed to scaled_mm (`_scaled_mm` 16-aligns them in any case)
    if backend == "scaled_mm_padded":
        backend, min_rows = "scaled_mm", PADDED_MIN_ROWS
    if backend == "deep_gemm":
        if deep_gemm_adapter.usable(x_fp8.device) and deep_gemm_adapter.fits(
            x_fp8, w_fp8, w_blocks, block, out_dtype, bias
        ):
            library = "deep_gemm"
        backend = "auto"
    caps = scaled_mm_caps(x_fp8.device)
    if backend == "scaled_mm" and caps is None:
        raise ValueError(f"fp8_blockwise_mm: backend='scaled_mm' is not available on {x_fp8.device}")
    if backend not in ("auto", "scaled_mm", "triton", "emulated"):
        raise ValueError(
            "fp8_blockwise_mm: backend must be auto|deep_gemm|scaled_mm|scaled_mm_padded|triton|emulated|"
            f"batch_invariant, got {backend!r}"
        )
    if backend == "triton" or (backend == "auto" and _triton_fits(x_fp8, w_fp8, w_blocks, block, caps)):
        if backend == "triton" and not (w_blocks == "128x128" and block == 128 and x_fp8.device.type == "cuda"):
            raise ValueError("fp8_blockwise_mm: backend='triton' needs CUDA operands and 128x128 weight tiles")
        from nemo_jetrl.precision.kernels import triton_gemm

        config = small_m_config(x_fp8, w_fp8, out_dtype, bias is not None, library if backend == "auto" else None)
        if config is not None:  # else the library GEMM (cuBLAS or DeepGEMM) measured faster for this shape
            return triton_gemm.fp8_gemm_small_m(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias, config)
    use_scaled = backend != "emulated" and caps is not None and _scaled_mm_fits(x_fp8, w_fp8, w_blocks, block, caps)
    if backend == "scaled_mm" and not use_scaled:
        raise ValueError(
            f"fp8_blockwise_mm: scaled_mm cannot take x {tuple(x_fp8.shape)}, w {tuple(w_fp8.shape)} ({w_blocks})"
        )
    with no_autocast(x_fp8.device.type):
        if library == "deep_gemm":
            return deep_gemm_adapter.fp8_gemm(x_fp8, x_scale, w_fp8, w_scale)
        if use_scaled:
            return _scaled_mm(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias, w_blocks, caps, min_rows)
        return _emulated_mm(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias, w_blocks, block, w_dequant)


def small_m_config(
    x_fp8: torch.Tensor, w_fp8: torch.Tensor, out_dtype: torch.dtype, has_bias: bool, library: Library | None
) -> tuple[int, int, int, int] | None:
    """The split-K Triton configuration "auto" runs this decode-sized product with (CUDA, 128x128 weight tiles), or
    None where the `library` GEMM measured faster; library None: the fastest Triton candidate. Timed once per shape
    (`kernels.triton_gemm.best_config`), outside any CUDA-graph capture."""
    from nemo_jetrl.precision.kernels import triton_gemm

    timed_against = _LIBRARY_GEMMS[library] if library is not None else None
    return triton_gemm.best_config(x_fp8, w_fp8, out_dtype, has_bias, timed_against)


def _scaled_mm_library(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias) -> torch.Tensor:
    return fp8_blockwise_mm(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias=bias, backend="scaled_mm")


def _deep_gemm_library(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias) -> torch.Tensor:
    return deep_gemm_adapter.fp8_gemm(x_fp8, x_scale, w_fp8, w_scale)  # bf16 out, no bias: as "auto" calls it


_LIBRARY_GEMMS = {"scaled_mm": _scaled_mm_library, "deep_gemm": _deep_gemm_library}


def no_autocast(device_type: str):
    """Autocast off for the block (FP32 emulation must not be downcast); free when it is already off."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def fp8_wgrad_mm(
    dy: torch.Tensor,
    x: torch.Tensor,
    *,
    x_blocks: WBlocks = "1x128",
    pow2: bool = False,
    out_dtype: torch.dtype = torch.float32,
    block: int = 128,
    backend: Literal["auto", "scaled_mm", "emulated"] = "auto",
) -> torch.Tensor:
    """WGrad dW [N, K] = dY^T [N, M] @ X [M, K], contraction over the M tokens, FP8 groups of `block` along M.

    dY^T is quantized in 1x128 groups along M; X^T in 1x128 groups along M (`x_blocks="1x128"`, exact Jet-RL) or in
    128x128 (channel x token) tiles (`"128x128"`, faster on Hopper). M is zero-padded to a multiple of `block`.
    """
    if dy.dim() != 2 or x.dim() != 2 or dy.shape[0] != x.shape[0]:
        raise ValueError(f"fp8_wgrad_mm: expected dy [M, N] and x [M, K], got {tuple(dy.shape)} and {tuple(x.shape)}")
    if x_blocks not in ("1x128", "128x128"):
        raise ValueError(f"fp8_wgrad_mm: x_blocks must be '1x128' or '128x128', got {x_blocks!r}")
    pad = -dy.shape[0] % block
    if pad:  # zero tokens add nothing to the sum over M
        dy, x = F.pad(dy, (0, 0, 0, pad)), F.pad(x, (0, 0, 0, pad))
    dyt_fp8, dyt_scale = act_quant_t(dy, block, pow2)  # dyt: [N, Mp], scale [N, Mp/128]
    if x_blocks == "1x128":
        xt_fp8, xt_scale = act_quant_t(x, block, pow2)  # xt: [K, Mp], scale [K, Mp/128]
    else:
        xt_fp8, xt_scale = weight_quant(x.t(), block, pow2)  # xt: [K, Mp], scale [K/128, Mp/128]
    return fp8_blockwise_mm(
        dyt_fp8, dyt_scale, xt_fp8, xt_scale, out_dtype, w_blocks=x_blocks, block=block, backend=backend
    )


# ----------------------------------------------------------------------------------------------------------------
# emulation (any device): the same bits and scales, FP32 math
# ----------------------------------------------------------------------------------------------------------------
def _emulated_mm(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias, w_blocks, block, wd=None) -> torch.Tensor:
    xd = act_dequant(x_fp8, x_scale, block)  # xd: [M, K] fp32
    if wd is None:
        wd = weight_dequant(w_fp8, w_scale, block) if w_blocks == "128x128" else act_dequant(w_fp8, w_scale, block)
    out = xd @ wd.t()  # out: [M, N] fp32
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


# ----------------------------------------------------------------------------------------------------------------
# Hopper: torch scaled_mm, DeepSeek-style blockwise recipes
# ----------------------------------------------------------------------------------------------------------------
def _triton_fits(x_fp8, w_fp8, w_blocks, block, caps: ScaledMMCaps | None) -> bool:
    """Decode-sized products on sm90 (where `caps` exists) with 128x128 weight tiles and row-contiguous operands."""
    return (
        caps is not None
        and x_fp8.shape[0] <= SMALL_M_MAX
        and w_blocks == "128x128"
        and _scaled_mm_fits(x_fp8, w_fp8, w_blocks, block, caps)
        and x_fp8.stride(1) == 1
        and w_fp8.stride(1) == 1
    )


def _scaled_mm_fits(x_fp8, w_fp8, w_blocks, block, caps: ScaledMMCaps) -> bool:
    k, n = x_fp8.shape[1], w_fp8.shape[0]
    if block != 128 or k % 128 or n % 128 or x_fp8.shape[0] == 0:
        return False
    return w_blocks == "128x128" or caps.groups_1x128_b


def _scaled_mm(
    x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias, w_blocks, caps: ScaledMMCaps, min_rows: int = 0
) -> torch.Tensor:
    m = x_fp8.shape[0]
    rows = max(m + -m % 16, min_rows)
    if rows != m:  # cuBLASLt wants 16-aligned dims (and `min_rows`); the added rows' outputs are sliced off
        x_fp8, a_scale = _with_rows(x_fp8, x_scale, rows)
    else:
        a_scale = _column_major(x_scale)  # a_scale: (M, K/128), column-major (the Triton quantizer writes it so)
    if w_blocks == "128x128":
        nb, kb = w_scale.shape
        rows = -(-kb // 4) * 4 if caps.pad_tile_scale_rows else kb
        if rows != kb:  # scaled_mm wants the K-blocks padded to a multiple of 4
            padded = w_scale.new_zeros(nb, rows)
            padded[:, :kb] = w_scale
            w_scale = padded
        b_scale = w_scale.contiguous().t()  # b_scale: (rows>=K/128, N/128), column-major
    else:
        b_scale = _column_major(w_scale)  # b_scale: (N, K/128), column-major
    if out_dtype == torch.bfloat16 or (out_dtype == torch.float32 and caps.fp32_out):
        gemm_dtype = out_dtype
    else:  # e.g. fp16 out, or fp32 where the GEMM only gives bf16
        gemm_dtype = torch.float32 if caps.fp32_out else torch.bfloat16
    fused_bias = bias is not None and gemm_dtype == torch.bfloat16  # scaled_mm takes a bf16 bias with bf16 out
    out = _call_scaled_mm(
        x_fp8,
        w_fp8.t(),  # b: [K, N] column-major view of the row-major [N, K]
        a_scale,
        b_scale,
        w_blocks,
        bias.to(torch.bfloat16) if fused_bias else None,
        gemm_dtype,
    )[:m]
    if bias is not None and not fused_bias:
        out = out.float() + bias.float()
    return out.to(out_dtype)


def _with_rows(x_fp8: torch.Tensor, x_scale: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x_fp8 [M, K] and x_scale [M, K/128] copied into `rows` >= M rows, the scales column-major as scaled_mm takes
    them: one copy each. The added rows are left unwritten: a GEMM's output row reads only its own row of x and its
    scales, so they change no bit of the M rows kept (`F.pad` took two fills and a third copy more)."""
    m, k = x_fp8.shape
    x_rows = torch.empty((rows, k), dtype=torch.uint8, device=x_fp8.device)  # x_rows: [Mp, K] e4m3 bits
    x_rows[:m].copy_(x_fp8.view(torch.uint8))
    s_rows = torch.empty((x_scale.shape[1], rows), dtype=x_scale.dtype, device=x_scale.device).t()  # [Mp, K/128]
    s_rows[:m].copy_(x_scale)
    return x_rows.view(_FP8), s_rows


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(0) == 1 and t.stride(1) == t.shape[0] else t.t().contiguous().t()


def _call_scaled_mm(a, b, a_scale, b_scale, w_blocks, bias, out_dtype) -> torch.Tensor:
    if hasattr(F, "scaled_mm"):
        st = F.ScalingType
        recipe_b = st.BlockWise128x128 if w_blocks == "128x128" else st.BlockWise1x128
        return F.scaled_mm(a, b, a_scale, st.BlockWise1x128, b_scale, recipe_b, bias=bias, output_dtype=out_dtype)
    return torch._scaled_mm(a, b, scale_a=a_scale, scale_b=b_scale, bias=bias, out_dtype=out_dtype)


@functools.cache
def _probe_scaled_mm(index: int) -> ScaledMMCaps | None:
    """Try the layouts on a small product (K/128 = 2, not a multiple of 4) against the emulation, once per GPU."""
    device = torch.device("cuda", index)
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    where = f"{device} ({name}, sm{major}{minor})"
    if (major, minor) != (9, 0) or not (hasattr(F, "scaled_mm") or hasattr(torch, "_scaled_mm")):
        logger.info("fp8 GEMM backend on %s: emulated (blockwise scaled_mm needs sm90)", where)
        return None
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(48, 256, device=device, generator=gen)
    w = torch.randn(256, 256, device=device, generator=gen)
    xq, xs = act_quant(x, backend="torch")
    wq, ws = weight_quant(w, backend="torch")
    wgq, wgs = act_quant(w, backend="torch")
    ref = act_dequant(xq, xs) @ weight_dequant(wq, ws).t()
    ref_g = act_dequant(xq, xs) @ act_dequant(wgq, wgs).t()

    def close(out, want):
        return out is not None and ((out.float() - want).norm() / want.norm()).item() < 1e-2

    def attempt(caps, ws_, wq_, blocks, out_dtype):
        try:
            return _scaled_mm(xq, xs, wq_, ws_, out_dtype, None, blocks, caps)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            logger.debug("scaled_mm probe (%s, %s, %s) failed: %s", caps, blocks, out_dtype, err)
            return None

    for pad_rows in (True, False):
        caps = ScaledMMCaps(pad_tile_scale_rows=pad_rows, fp32_out=False, groups_1x128_b=False)
        if close(attempt(caps, ws, wq, "128x128", torch.bfloat16), ref):
            break
    else:
        logger.warning("fp8 GEMM backend on %s: emulated (blockwise scaled_mm rejected or wrong)", where)
        return None
    fp32_out = close(attempt(dataclasses.replace(caps, fp32_out=True), ws, wq, "128x128", torch.float32), ref)
    groups = close(attempt(caps, wgs, wgq, "1x128", torch.bfloat16), ref_g)
    caps = ScaledMMCaps(pad_tile_scale_rows=pad_rows, fp32_out=fp32_out, groups_1x128_b=groups)
    logger.info("fp8 GEMM backend on %s: scaled_mm blockwise 1x128 x 128x128 (%s)", where, caps)
    return caps


def _check_operands(x_fp8, x_scale, w_fp8, w_scale, w_blocks, block) -> None:
    if x_fp8.dtype != _FP8 or w_fp8.dtype != _FP8:
        raise ValueError(f"fp8_blockwise_mm: operands must be float8_e4m3fn, got {x_fp8.dtype} and {w_fp8.dtype}")
    if x_fp8.dim() != 2 or w_fp8.dim() != 2 or x_fp8.shape[1] != w_fp8.shape[1]:
        raise ValueError(
            f"fp8_blockwise_mm: expected x [M, K] and w [N, K], got {tuple(x_fp8.shape)} and {tuple(w_fp8.shape)}"
        )
    (m, k), n = x_fp8.shape, w_fp8.shape[0]
    kb = -(-k // block)
    if tuple(x_scale.shape) != (m, kb):
        raise ValueError(f"fp8_blockwise_mm: x_scale must be {(m, kb)} (1x{block} groups), got {tuple(x_scale.shape)}")
    if w_blocks == "128x128":
        want = (-(-n // block), kb)
    elif w_blocks == "1x128":
        want = (n, kb)
    else:
        raise ValueError(f"fp8_blockwise_mm: w_blocks must be '128x128' or '1x128', got {w_blocks!r}")
    if tuple(w_scale.shape) != want:
        raise ValueError(f"fp8_blockwise_mm: w_scale must be {want} for {w_blocks} blocks, got {tuple(w_scale.shape)}")
    if x_scale.dtype != torch.float32 or w_scale.dtype != torch.float32:
        raise ValueError("fp8_blockwise_mm: scales must be float32")
