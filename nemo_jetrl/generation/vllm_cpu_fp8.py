"""The recipe's FP8 forward as vLLM's CPU block-FP8 kernel, for the vLLM adapter (`vllm_engine.py`).

vLLM's own CPU block-FP8 kernels need AMX tiles and compute W8A16. `register_cpu_fp8_kernel` puts
`JetrlFp8BlockKernel` first in vLLM's CPU kernel list: the recipe's 1x128 activation quantizer and the project's
exact FP8 GEMM (`precision.linear.fp8_linear_forward`), i.e. the native rollout's forward on the bits vLLM holds,
behind one opaque custom op (`jetrl::vllm_fp8_linear`) so vLLM's torch.compile does not trace into it. vLLM is
imported only when the kernel is registered.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.linear import QuantizedWeight, fp8_linear_forward


@torch.library.custom_op("jetrl::vllm_fp8_linear", mutates_args=())
def _vllm_fp8_linear(
    x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, block: int, pow2: bool
) -> torch.Tensor:
    """`fp8_linear_forward` on vLLM's tensors: x2 [M, K], weight e4m3 [N, K], scale fp32 [N/b, K/b] -> [M, N].
    A custom op, so vLLM's torch.compile treats the recipe's quantizer and GEMM as one opaque call."""
    recipe = PrecisionRecipe(block_size=block, pow2_activation_scales=pow2)
    return fp8_linear_forward(x2, QuantizedWeight(weight, scale, 0, block), bias, recipe, x2.dtype)


@_vllm_fp8_linear.register_fake
def _(x2, weight, scale, bias, block, pow2):
    return x2.new_empty(x2.shape[0], weight.shape[0])


def register_cpu_fp8_kernel(recipe: PrecisionRecipe) -> None:
    """Put `JetrlFp8BlockKernel` (this recipe's FP8 forward) first among vLLM's CPU block-FP8 kernels."""
    from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_BLOCK_KERNELS
    from vllm.model_executor.kernels.linear.scaled_mm.BlockScaledMMLinearKernel import Fp8BlockScaledMMLinearKernel
    from vllm.platforms import PlatformEnum, current_platform

    class JetrlFp8BlockKernel(Fp8BlockScaledMMLinearKernel):
        """Y = Q(X) (1x128 groups, the recipe's quantizer) @ W(e4m3, 128x128 scales)^T, the project's exact GEMM.
        Weights stay as loaded (no repacking), so what vLLM holds can be read back bit for bit."""

        apply_input_quant = False
        jetrl_recipe = recipe

        @classmethod
        def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
            return (True, None) if current_platform.is_cpu() else (False, "CPU only")

        @classmethod
        def can_implement(cls, config) -> tuple[bool, str | None]:
            shape = config.weight_quant_key.scale.group_shape
            block = cls.jetrl_recipe.block_size
            if (shape.row, shape.col) != (block, block):
                return False, f"needs {block}x{block} weight blocks, got {shape.row}x{shape.col}"
            return True, None

        def process_weights_after_loading(self, layer: nn.Module) -> None:
            pass  # the loaded e4m3 bits and scales are used as they are

        def apply_weights(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None, **kw):
            recipe = self.jetrl_recipe
            x2 = x.reshape(-1, x.shape[-1])  # [M, K]
            y2 = torch.ops.jetrl.vllm_fp8_linear(
                x2, layer.weight, layer.weight_scale_inv, bias, recipe.block_size, recipe.pow2_activation_scales
            )  # [M, N]
            return y2.reshape(*x.shape[:-1], y2.shape[-1])

        def apply_block_scaled_mm(self, A, B, As, Bs):  # pragma: no cover - apply_weights is overridden
            raise NotImplementedError

    kernels = _POSSIBLE_FP8_BLOCK_KERNELS[PlatformEnum.CPU]
    kernels[:] = [JetrlFp8BlockKernel] + [k for k in kernels if k.__name__ != JetrlFp8BlockKernel.__name__]
