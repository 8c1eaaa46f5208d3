"""Blockwise E4M3 quantizers (DeepSeek-V3 / Jet-RL layout) and their inverses.

Pure-torch reference (the CPU path and the spec the Triton twins in `kernels/` match bit for bit):

    amax  = max |x| over the block           (NaN ignored, +-inf counted as FLT_MAX: see below)
    scale = max(amax, 1e-10) * float32(1/448)  (an FP32 *dequantization* multiplier, vLLM's weight_scale_inv)
    scale = 2**ceil(log2(scale))             (optional, `pow2=True`; computed exactly on the exponent bits)
    q     = clamp(x / scale, -448, 448)      (IEEE round-to-nearest division) -> e4m3 (round-to-nearest-even)

Layouts: activations / gradients use 1x`block` groups along the last dim (`act_quant`), weights `block`x`block`
tiles (`weight_quant`), the WGrad operands groups along the token dim M (`act_quant_t`, i.e. 128x1 on [M, K]).
Dims that are not multiples of `block` give a partial last block, zero-padded for the amax.

Non-finite inputs (chosen: saturate, never a NaN scale): NaN is ignored by the amax and stays NaN in its own
position; +-inf counts as +-FLT_MAX for the amax and saturates to +-448 (times the scale). All scales are finite.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Literal

import torch
import torch.nn.functional as F

# The format's constants and scale rule live in e4m3.py (the Triton twins read them there); re-exported here.
from nemo_jetrl.precision.e4m3 import (  # noqa: F401
    E4M3_MAX,
    FLT_MAX,
    FP8_DTYPE,
    INV_E4M3_MAX,
    SCALE_EPS,
    pow2_ceil,
    scale_from_amax,
)

QuantBackend = Literal["auto", "torch", "triton"]
_BACKENDS = ("auto", "torch", "triton")


# ----------------------------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------------------------
def act_quant(
    x: torch.Tensor, block: int = 128, pow2: bool = False, backend: QuantBackend = "auto", zero_rows: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """1x`block` groups along the last dim. x: [..., K] -> (e4m3 [..., K], fp32 scale [..., ceil(K/block)]).

    `zero_rows`: x may hold all-zero rows (a gradient): the Triton kernel then divides in the form that keeps its
    speed on zeros (`triton_quant.division_for`); the bits are the same."""
    _check_input(x, block, "act_quant", min_dim=1)
    if _use_triton(x, block, backend):
        from nemo_jetrl.precision.kernels import triton_quant

        x2 = x.reshape(-1, x.shape[-1])  # x2: [R, K]
        q, s = triton_quant.quant_groups(x2, block, pow2, zero_rows=zero_rows)
        return q.view(x.shape), s.view(*x.shape[:-1], s.shape[-1])
    return _act_quant_ref(x, block, pow2)


def act_quant_t(
    x: torch.Tensor, block: int = 128, pow2: bool = False, backend: QuantBackend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """WGrad-side quantizer: groups of `block` along the token dim M of x [M, K].

    Returns the transposed operand (e4m3 [K, M], fp32 scale [K, ceil(M/block)]), bitwise equal to
    `act_quant(x.t().contiguous())`.
    """
    _check_input(x, block, "act_quant_t", min_dim=2)
    if x.dim() != 2:
        raise ValueError(f"act_quant_t expects a 2-D [M, K] tensor, got shape {tuple(x.shape)}")
    if _use_triton(x, block, backend):
        from nemo_jetrl.precision.kernels import triton_quant

        return triton_quant.quant_groups(x.t(), block, pow2)
    return _act_quant_ref_t(x, block, pow2)


def act_quant_dual(
    x: torch.Tensor,
    block: int = 128,
    pow2: bool = False,
    t_blocks: Literal["1x128", "128x128"] = "1x128",
    backend: QuantBackend = "auto",
    zero_rows: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both training layouts of x [M, K]: the FProp/DGrad operand and the WGrad operand.

    Returns (q [M, K], s [M, ceil(K/b)]) in 1x`block` groups along K, bitwise `act_quant(x)`, and the WGrad
    operand (qt [K, MP], st) for x zero-padded to MP = round_up(M, block) tokens: bitwise
    `act_quant_t(x_padded)` (st [K, MP/b], `t_blocks="1x128"`) or `weight_quant(x_padded.t())`
    (st [ceil(K/b), MP/b], `"128x128"`). On CUDA these are two Triton kernels (a fused single-read kernel
    measured slower: docs/precision.md, "Measured figures"). `zero_rows`: as `act_quant`'s.
    """
    _check_input(x, block, "act_quant_dual", min_dim=2)
    if x.dim() != 2:
        raise ValueError(f"act_quant_dual expects a 2-D [M, K] tensor, got shape {tuple(x.shape)}")
    if t_blocks not in ("1x128", "128x128"):
        raise ValueError(f"act_quant_dual: t_blocks must be '1x128' or '128x128', got {t_blocks!r}")
    pad = -x.shape[0] % block
    if _use_triton(x, block, backend):
        from nemo_jetrl.precision.kernels import triton_quant

        q, s = triton_quant.quant_groups(x, block, pow2, zero_rows=zero_rows)
        if t_blocks == "1x128":  # the zero tokens come from the kernel's masked loads: no padded copy of x
            qt, st = triton_quant.quant_groups(x.t(), block, pow2, zero_rows=zero_rows, width=x.shape[0] + pad)
        else:
            qt, st = triton_quant.quant_tiles((F.pad(x, (0, 0, 0, pad)) if pad else x).t(), block, pow2)
        return q, s, qt, st
    xp = F.pad(x, (0, 0, 0, pad)) if pad else x  # xp: [MP, K], zero tokens
    q, s = _act_quant_ref(x, block, pow2)
    qt, st = _act_quant_ref_t(xp, block, pow2) if t_blocks == "1x128" else _weight_quant_ref(xp.t(), block, pow2)
    return q, s, qt, st


def weight_quant(
    w: torch.Tensor, block: int = 128, pow2: bool = False, backend: QuantBackend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """`block`x`block` tiles. w: [N, K] -> (e4m3 [N, K], fp32 scale [ceil(N/block), ceil(K/block)])."""
    _check_input(w, block, "weight_quant", min_dim=2)
    if w.dim() != 2:
        raise ValueError(f"weight_quant expects a 2-D [N, K] tensor, got shape {tuple(w.shape)}")
    if _use_triton(w, block, backend):
        from nemo_jetrl.precision.kernels import triton_quant

        return triton_quant.quant_tiles(w, block, pow2)
    return _weight_quant_ref(w, block, pow2)


def weight_quant_checked(
    w: torch.Tensor, block: int = 128, pow2: bool = False, backend: QuantBackend = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weight_quant(w)` and the number of non-finite values of w (int32 0-dim tensor on w's device), counted in
    the same pass on CUDA. The scales alone cannot tell: the amax ignores NaN and saturates inf."""
    _check_input(w, block, "weight_quant", min_dim=2)
    if w.dim() != 2:
        raise ValueError(f"weight_quant expects a 2-D [N, K] tensor, got shape {tuple(w.shape)}")
    if _use_triton(w, block, backend):
        from nemo_jetrl.precision.kernels import triton_quant

        count = torch.zeros(1, dtype=torch.int32, device=w.device)
        q, s = triton_quant.quant_tiles(w, block, pow2, nonfinite=count)
        return q, s, count[0]
    q, s = _weight_quant_ref(w, block, pow2)
    return q, s, (~torch.isfinite(w)).sum().to(torch.int32)


def act_dequant(
    x_fp8: torch.Tensor, scale: torch.Tensor, block: int = 128, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of `act_quant`: e4m3 [..., K] * scale [..., ceil(K/block)] -> `dtype` [..., K] (math in FP32)."""
    k = x_fp8.shape[-1]
    if scale.shape != (*x_fp8.shape[:-1], _cdiv(k, block)):
        raise ValueError(
            f"act_dequant: scale shape {tuple(scale.shape)} does not match values {tuple(x_fp8.shape)} "
            f"with 1x{block} groups (expected {(*x_fp8.shape[:-1], _cdiv(k, block))})"
        )
    nb = scale.shape[-1]
    xf = e4m3_to_float(x_fp8)
    if nb * block != k:
        xf = F.pad(xf, (0, nb * block - k))
    xf = xf.reshape(*x_fp8.shape[:-1], nb, block)  # xf: [..., nb, block]
    return (xf * scale.float().unsqueeze(-1)).reshape(*x_fp8.shape[:-1], nb * block)[..., :k].to(dtype)


def weight_dequant(
    w_fp8: torch.Tensor, scale: torch.Tensor, block: int = 128, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of `weight_quant`: e4m3 [N, K] * scale [ceil(N/b), ceil(K/b)] -> `dtype` [N, K] (math in FP32)."""
    if w_fp8.dim() != 2:
        raise ValueError(f"weight_dequant expects a 2-D [N, K] tensor, got shape {tuple(w_fp8.shape)}")
    n, k = w_fp8.shape
    if scale.shape != (_cdiv(n, block), _cdiv(k, block)):
        raise ValueError(
            f"weight_dequant: scale shape {tuple(scale.shape)} does not match values {(n, k)} with "
            f"{block}x{block} blocks (expected {(_cdiv(n, block), _cdiv(k, block))})"
        )
    nbn, nbk = scale.shape
    wf = e4m3_to_float(w_fp8)
    if (nbn * block, nbk * block) != (n, k):
        wf = F.pad(wf, (0, nbk * block - k, 0, nbn * block - n))
    wf = wf.view(nbn, block, nbk, block)
    wf = wf * scale.float()[:, None, :, None]  # wf: [nbN, block, nbK, block]
    return wf.view(nbn * block, nbk * block)[:n, :k].to(dtype)


def e4m3_to_float(q: torch.Tensor) -> torch.Tensor:
    """Exact e4m3fn -> fp32 through a 256-entry table (CPU's elementwise fp8 cast is slow)."""
    if q.is_cuda:
        return q.float()
    codes = q.reshape(-1).view(torch.uint8).int()  # int32 codes: index_select is the fast gather on CPU
    return _e4m3_table(q.device).index_select(0, codes).view(q.shape)


@functools.cache
def _e4m3_table(device: torch.device) -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float().to(device)


# ----------------------------------------------------------------------------------------------------------------
# reference implementation (pure torch, any device)
# ----------------------------------------------------------------------------------------------------------------
def _block_amax(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """max |x| over `dims`, NaN ignored and inf counted as FLT_MAX (a fast pass first on CPU, fixed if needed)."""
    if not x.is_cuda:  # no device sync on CPU: take the one-pass result when it is finite (the common case)
        if len(dims) == 1:  # max(max x, -min x) == max |x| exactly, no |x| temporary (amax + amin beat aminmax)
            amax = torch.maximum(x.amax(dim=dims[0]), x.amin(dim=dims[0]).neg_())
            if bool(torch.isfinite(amax).all()):
                return amax
        else:
            amax = x.abs()
            for d in dims:
                amax = amax.amax(dim=d, keepdim=True)
            if bool(torch.isfinite(amax).all()):
                return amax.squeeze(dims)
    amax = torch.nan_to_num(x.abs(), nan=0.0, posinf=FLT_MAX)
    for d in dims:
        amax = amax.amax(dim=d, keepdim=True)
    return amax.squeeze(dims)


def _to_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    q = x / scale  # IEEE division (a tensor divisor is never turned into a reciprocal multiply)
    return q.clamp_(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)  # clamp keeps NaN


def _act_quant_ref(x: torch.Tensor, block: int, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    k = x.shape[-1]
    nb = _cdiv(k, block)
    xf = x.float()
    if nb * block != k:
        xf = F.pad(xf, (0, nb * block - k))  # zero-pad the partial last group
    xg = xf.reshape(*x.shape[:-1], nb, block)  # xg: [..., nb, block]
    scale = scale_from_amax(_block_amax(xg, (-1,)), pow2)  # scale: [..., nb]
    q = _to_e4m3(xg, scale.unsqueeze(-1))
    return q.reshape(*x.shape[:-1], nb * block)[..., :k].contiguous(), scale


def _act_quant_ref_t(x: torch.Tensor, block: int, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`_act_quant_ref(x.t())` bit for bit, computed in x's own [M, K] layout (groups along M): the reductions
    and elementwise passes stay contiguous and only the e4m3 bytes are transposed."""
    m, k = x.shape
    nb = _cdiv(m, block)
    xf = x.float()
    if nb * block != m:
        xf = F.pad(xf, (0, 0, 0, nb * block - m))  # zero-pad the partial last group of tokens
    xg = xf.reshape(nb, block, k)  # xg: [nb, block, K]
    scale = scale_from_amax(_block_amax(xg, (1,)), pow2)  # scale: [nb, K]
    q = _to_e4m3(xg, scale.unsqueeze(1)).reshape(nb * block, k)[:m]  # q: [M, K]
    return q.t().contiguous(), scale.t().contiguous()  # [K, M], [K, nb]


def _weight_quant_ref(w: torch.Tensor, block: int, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    nbn, nbk = _cdiv(n, block), _cdiv(k, block)
    wf = w.float()
    if (nbn * block, nbk * block) != (n, k):
        wf = F.pad(wf, (0, nbk * block - k, 0, nbn * block - n))
    wt = wf.reshape(nbn, block, nbk, block)  # wt: [nbN, block, nbK, block]
    scale = scale_from_amax(_block_amax(wt, (3, 1)), pow2)  # scale: [nbN, nbK]
    q = _to_e4m3(wt, scale[:, None, :, None])
    return q.reshape(nbn * block, nbk * block)[:n, :k].contiguous(), scale


# ----------------------------------------------------------------------------------------------------------------
# dispatch helpers
# ----------------------------------------------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_input(x: torch.Tensor, block: int, name: str, min_dim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.element_size() < 2:
        raise ValueError(f"{name}: expected a float16/bfloat16/float32 tensor, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name}: expected at least {min_dim} dim(s), got shape {tuple(x.shape)}")
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise ValueError(f"{name}: block must be a positive int, got {block!r}")


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def _use_triton(x: torch.Tensor, block: int, backend: str) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"quant backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    pow2_block = block & (block - 1) == 0 and block >= 16
    if backend == "triton":
        if not x.is_cuda:
            raise ValueError("quant backend='triton' needs a CUDA tensor (use 'torch' or 'auto' on CPU)")
        if not triton_available():
            raise ValueError("quant backend='triton' requested but triton is not importable")
        if not pow2_block:
            raise ValueError(f"quant backend='triton' needs a power-of-two block >= 16, got {block}")
        return True
    return x.is_cuda and pow2_block and x.numel() > 0 and triton_available()
