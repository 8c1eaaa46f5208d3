"""Which GEMM runs each product of an FP8 linear: chosen here, from the recipe and the linear's switches, only.

`choose_gemm(recipe, exact=..., cublas=...)` -> `GemmChoice(fprop, dgrad, wgrad)`:

- the recipe: `use_deep_gemm` puts FProp and DGrad on DeepGEMM where its layout supports it
  (`LayoutFeatures.deep_gemm`); WGrad stays on cuBLAS;
- the linear (`linear_gemm(module)`): the exact mode's batch-invariant forward GEMM (`batch_invariant`, set by
  `models.batch_invariant.enable_batch_invariant`) wins over cuBLAS at every M (`fprop_cublas`,
  `convert.use_cublas_fprop`); the layout refuses either when it has none (`LayoutFeatures.exact_gemm`);
- behind "auto" / "deep_gemm", per product: the device probe (`gemm.gemm_backend`: scaled_mm on sm90, the exact
  emulation elsewhere, once per GPU) and the per-shape tuning of decode-sized products (`kernels/triton_gemm`:
  the split-K Triton kernel where it measured faster than the library GEMM, once per shape).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from nemo_jetrl.precision import deep_gemm_adapter
from nemo_jetrl.precision.recipes.base import layouts_with

if TYPE_CHECKING:
    from nemo_jetrl.precision.recipe import PrecisionRecipe

FpropBackend = Literal["auto", "deep_gemm", "batch_invariant", "scaled_mm"]
LibraryBackend = Literal["auto", "deep_gemm"]


@dataclass(frozen=True)
class GemmChoice:
    """The GEMM family of FProp (trainer and rollout), DGrad and WGrad for one FP8 linear (see the module doc)."""

    fprop: FpropBackend = "auto"
    dgrad: LibraryBackend = "auto"
    wgrad: Literal["auto"] = "auto"


def choose_gemm(recipe: PrecisionRecipe, *, exact: bool = False, cublas: bool = False) -> GemmChoice:
    """The GEMMs of a linear of `recipe`; `exact`: the exact mode's forward GEMM; `cublas`: cuBLAS at every M."""
    deep_gemm = bool(recipe.use_deep_gemm) and recipe.layout.features.deep_gemm
    return _CHOICES[deep_gemm, bool(exact), bool(cublas)]


def _choice(deep_gemm: bool, exact: bool, cublas: bool) -> GemmChoice:
    library: LibraryBackend = "deep_gemm" if deep_gemm else "auto"
    fprop: FpropBackend = "batch_invariant" if exact else "scaled_mm" if cublas else library
    return GemmChoice(fprop=fprop, dgrad=library)


# every (DeepGEMM, exact, cuBLAS) combination, built once: the forward asks per call
_CHOICES = {key: _choice(*key) for key in itertools.product((False, True), repeat=3)}


def linear_gemm(module: nn.Module) -> GemmChoice:
    """The GEMMs of an FP8 linear (`Fp8Linear`, `Fp8RolloutLinear`) now: its recipe and its kernel switches."""
    exact, cublas = getattr(module, "batch_invariant", False), getattr(module, "fprop_cublas", False)
    return choose_gemm(module.recipe, exact=exact, cublas=cublas)


def fprop_backend(module: nn.Module) -> FpropBackend:
    """The forward GEMM of an FP8 linear (`linear_gemm(module).fprop`)."""
    return linear_gemm(module).fprop


def library_backend(recipe: PrecisionRecipe) -> LibraryBackend:
    """The FProp / DGrad GEMM family of `recipe` without the linear's switches: "deep_gemm" or "auto"."""
    return choose_gemm(recipe).dgrad


def deep_gemm_status(recipe: PrecisionRecipe, device: torch.device | str) -> str:
    """What `use_deep_gemm: true` does for `recipe` on `device`, for the run's start-up lines."""
    layout = recipe.layout
    unsupported = None if layout.features.deep_gemm else (layout.name, layouts_with("deep_gemm"))
    return deep_gemm_adapter.status_line(device, *(unsupported or ()))
