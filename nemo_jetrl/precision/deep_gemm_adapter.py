"""DeepGEMM (deepseek-ai/DeepGEMM, optional, not vendored) behind the recipe's blockwise FProp and DGrad GEMMs.

`policy.fp8_cfg.use_deep_gemm: true` (NeMo-RL: `policy.generation.vllm_cfg.use_deep_gemm`) hands every blockwise
product that `fp8_blockwise_mm(backend="deep_gemm")` would give cuBLAS `scaled_mm` to `deep_gemm.fp8_gemm_nt`
instead, for the trainer and the rollout alike (the small-M tuner then times the Triton kernel against DeepGEMM).
The operands are the recipe's own (1x128 activation / gradient groups, 128x128 weight tiles, FP32 scales): the
same FP8 values and scales, only the kernel's FP32 summation order may differ from cuBLAS's in the last bits
(tests/gpu/test_deep_gemm_gpu.py; docs/performance.md says where the outputs were identical). WGrad (groups along
the tokens, FP32 sums) stays on cuBLAS, which runs it faster.

As in NeMo-RL (where vLLM falls back when DeepGEMM is missing), the switch is a request: where deep_gemm does not
import or the GPU is not sm90, `unusable_reason` says why and the GEMMs stay on cuBLAS / Triton; the run prints
that reason at start (`status_line`).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

_FP8 = torch.float8_e4m3fn
TILE = 128  # DeepGEMM's sm90 FP8 kernels: 1x128 A groups, 128x128 B tiles


@functools.cache
def _import() -> tuple[ModuleType | None, str | None]:
    """(deep_gemm, None), or (None, why it does not import)."""
    try:
        import deep_gemm
    except Exception as exc:  # ImportError, or a broken build (undefined symbols, missing CUDA)
        return None, f"deep_gemm does not import ({type(exc).__name__}: {exc})"
    return deep_gemm, None


def unusable_reason(device: torch.device | str) -> str | None:
    """Why DeepGEMM cannot run blockwise FP8 GEMMs on `device` (None when it can): not CUDA, not sm90, no deep_gemm."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"DeepGEMM runs on CUDA sm90 GPUs; the GEMMs here run on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"this build uses DeepGEMM's sm90 kernels; the GPU is sm{major}{minor}"
    return _import()[1]


@functools.cache
def _usable(device_index: int) -> bool:
    return unusable_reason(torch.device("cuda", device_index)) is None


def usable(device: torch.device) -> bool:
    """Whether `fp8_gemm` can run on `device` (checked once per device)."""
    if device.type != "cuda":
        return False
    return _usable(device.index if device.index is not None else torch.cuda.current_device())


def version() -> str | None:
    module = _import()[0]
    return getattr(module, "__version__", "unknown") if module is not None else None


def status_line(
    device: torch.device | str, unsupported_layout: str | None = None, its_layouts: str = "blockwise"
) -> str:
    """What `use_deep_gemm: true` does on `device`, for the run's start-up lines; `unsupported_layout`: the recipe's
    scale layout when DeepGEMM does not take its products (`its_layouts`: the ones it takes), said as the reason
    (`recipes.gemm_choice.deep_gemm_status` asks the layout)."""
    reason = unusable_reason(device)
    if unsupported_layout is not None:
        reason = f"DeepGEMM runs the {its_layouts} recipe's products, not the {unsupported_layout} one's"
    if reason is None:
        return f"use_deep_gemm: blockwise FProp / DGrad GEMMs on DeepGEMM {version()}"
    return f"use_deep_gemm: not used, the FP8 GEMMs stay on cuBLAS / Triton: {reason}"


def fits(
    x_fp8: torch.Tensor,
    w_fp8: torch.Tensor,
    w_blocks: str,
    block: int,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
) -> bool:
    """Whether `fp8_gemm` takes this product: the recipe's 128x128 weight tiles and 1x128 input groups, BF16 out, no
    bias (DeepGEMM has none), N and K whole tiles, both operands row-major e4m3."""
    m, k = x_fp8.shape
    n = w_fp8.shape[0]
    return (
        w_blocks == "128x128"
        and block == TILE
        and bias is None
        and out_dtype == torch.bfloat16
        and x_fp8.dtype == _FP8
        and w_fp8.dtype == _FP8
        and m > 0
        and n % TILE == 0
        and k % TILE == 0
        and x_fp8.is_contiguous()
        and w_fp8.is_contiguous()
    )


def fp8_gemm(x_fp8: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Y [M, N] bf16 = dequant(x_fp8 [M, K], x_scale [M, K/128]) @ dequant(w_fp8 [N, K], w_scale [N/128, K/128])^T
    through `deep_gemm.fp8_gemm_nt` (call only where `usable` and `fits`)."""
    deep_gemm = _import()[0]
    y = torch.empty(x_fp8.shape[0], w_fp8.shape[0], device=x_fp8.device, dtype=torch.bfloat16)  # [M, N]
    # The A scales must be MN-major with M padded for TMA: a view when act_quant's column-major layout already is.
    a_scale = deep_gemm.get_mn_major_tma_aligned_tensor(x_scale)
    deep_gemm.fp8_gemm_nt((x_fp8, a_scale), (w_fp8, w_scale.contiguous()), y)
    return y
