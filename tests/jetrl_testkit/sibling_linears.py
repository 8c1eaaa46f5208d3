"""Sibling FP8 linears over one input (q/k/v, gate/up), forward and backward, grouped or one by one."""

from __future__ import annotations

import torch

from nemo_jetrl.precision import Fp8Linear, Fp8WeightGroup, PrecisionRecipe, project_shared_input


def sibling_linear_grads(
    recipe: PrecisionRecipe, grouped: bool, k: int, splits: tuple[int, ...], m: int, device: torch.device
) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """(Y_i [m, N_i], dX [m, k], dW_i [N_i, k]) of bias-free BF16 `Fp8Linear`s of widths `splits` reading one
    random X [m, k], backpropagating random dY_i; `grouped`: their FP8 weights in one `Fp8WeightGroup` (one GEMM per
    pass on CUDA). Seeded: the same weights and tensors on every call."""
    torch.manual_seed(0)
    linears = [Fp8Linear(k, n, bias=False, recipe=recipe, device=device, dtype=torch.bfloat16) for n in splits]
    if grouped:
        Fp8WeightGroup(linears)
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(m, k, device=device, generator=gen, dtype=torch.bfloat16).requires_grad_(True)
    dys = [torch.randn(m, n, device=device, generator=gen, dtype=torch.bfloat16) for n in splits]
    ys = project_shared_input(x, linears)  # one GEMM per pass when grouped, else each linear's own
    torch.autograd.backward(ys, dys)
    return [y.detach() for y in ys], x.grad, [linear.weight.grad for linear in linears]
