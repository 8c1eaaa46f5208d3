"""Which GEMM runs each product of an FP8 linear: chosen here, from the recipe and the linear's one switch, only.

`choose_gemm(recipe, kernel)` -> `GemmChoice(fprop, dgrad, wgrad)`:

- the recipe: `use_deep_gemm` puts FProp and DGrad on DeepGEMM where its layout supports it
  (`LayoutFeatures.deep_gemm`); WGrad stays on cuBLAS;
- the linear (`linear_gemm(module)`): its `fprop_kernel` (`FpropKernel`: one value, so two switches cannot
  contradict each other), set by one function per switch: `models.batch_invariant.enable_batch_invariant` (the
  exact mode's batch-invariant forward GEMM), `convert.use_cublas_fprop` (cuBLAS at every M: the matched kernels'),
  `models.batch_invariant.unmatch_kernels` (back to auto); the exact GEMM wins over cuBLAS whatever the order
  (`FpropKernel.with_exact` / `with_cublas`); the layout refuses either when it has none (`LayoutFeatures.exact_gemm`);
- behind "auto" / "deep_gemm", per product: the device probe (`gemm.gemm_backend`: scaled_mm on sm90, the exact
  emulation elsewhere, once per GPU) and the per-shape tuning of decode-sized products (`kernels/triton_gemm`:
  the split-K Triton kernel where it measured faster than the library GEMM, once per shape).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from nemo_jetrl.precision import deep_gemm_adapter
from nemo_jetrl.precision.recipes.base import layouts_with

if TYPE_CHECKING:
    from nemo_jetrl.precision.recipe import PrecisionRecipe

FpropBackend = Literal["auto", "deep_gemm", "batch_invariant", "scaled_mm_padded"]
LibraryBackend = Literal["auto", "deep_gemm"]


class FpropKernel(enum.Enum):
    """How a linear's forward GEMM is chosen: AUTO (the recipe's library GEMM, the device probe and the per-shape
    tuning deciding), CUBLAS (cuBLAS at every M, decode batches included, over at least `gemm.PADDED_MIN_ROWS`
    rows), BATCH_INVARIANT (the exact mode's kernel: one K order whatever the shape). `FpropKernel("...")` refuses
    any other name."""

    AUTO = "auto"
    CUBLAS = "cublas"
    BATCH_INVARIANT = "batch_invariant"

    @classmethod
    def _missing_(cls, value: object) -> FpropKernel:
        raise ValueError(f"FpropKernel must be one of {[k.value for k in cls]}, got {value!r}")

    def with_exact(self, on: bool) -> FpropKernel:
        """`enable_batch_invariant`'s switch: the exact GEMM on; off turns only the exact GEMM back to AUTO."""
        if on:
            return FpropKernel.BATCH_INVARIANT
        return FpropKernel.AUTO if self is FpropKernel.BATCH_INVARIANT else self

    def with_cublas(self, on: bool) -> FpropKernel:
        """`use_cublas_fprop` (on) / `unmatch_kernels` (off): cuBLAS where the exact GEMM does not run (it wins)."""
        if self is FpropKernel.BATCH_INVARIANT:
            return self
        return FpropKernel.CUBLAS if on else FpropKernel.AUTO


# the forward GEMM each kernel choice pins; AUTO leaves it to the recipe's library
_PINNED: dict[FpropKernel, FpropBackend] = {
    FpropKernel.CUBLAS: "scaled_mm_padded",  # at least `gemm.PADDED_MIN_ROWS` rows: one cuBLAS kernel family
    FpropKernel.BATCH_INVARIANT: "batch_invariant",
}


class FpropKernelSwitch:
    """Mixin of a linear whose forward GEMM is switched: one `fprop_kernel` (an `FpropKernel`, AUTO until a switch
    sets it), checked on assignment against the kernels the class runs (`FPROP_KERNELS`)."""

    FPROP_KERNELS: tuple[FpropKernel, ...] = tuple(FpropKernel)
    _fprop_kernel = FpropKernel.AUTO

    @property
    def fprop_kernel(self) -> FpropKernel:
        return self._fprop_kernel

    @fprop_kernel.setter
    def fprop_kernel(self, value: FpropKernel | str) -> None:
        kernel = FpropKernel(value)
        if kernel not in self.FPROP_KERNELS:
            names = [k.value for k in self.FPROP_KERNELS]
            raise ValueError(f"{type(self).__name__}.fprop_kernel must be one of {names}, got {kernel.value!r}")
        self._fprop_kernel = kernel

    @property
    def exact_fprop(self) -> bool:
        """Whether the forward runs the exact mode's batch-invariant product."""
        return self._fprop_kernel is FpropKernel.BATCH_INVARIANT


@dataclass(frozen=True)
class GemmChoice:
    """The GEMM family of FProp (trainer and rollout), DGrad and WGrad for one FP8 linear (see the module doc)."""

    fprop: FpropBackend = "auto"
    dgrad: LibraryBackend = "auto"
    wgrad: Literal["auto"] = "auto"


def choose_gemm(recipe: PrecisionRecipe, kernel: FpropKernel = FpropKernel.AUTO) -> GemmChoice:
    """The GEMMs of a linear of `recipe` whose forward GEMM is chosen by `kernel`."""
    deep_gemm = bool(recipe.use_deep_gemm) and recipe.layout.features.deep_gemm
    return _CHOICES[deep_gemm, kernel]


def _choice(deep_gemm: bool, kernel: FpropKernel) -> GemmChoice:
    library: LibraryBackend = "deep_gemm" if deep_gemm else "auto"
    return GemmChoice(fprop=_PINNED.get(kernel, library), dgrad=library)


# every (DeepGEMM, kernel) combination, built once: the forward asks per call
_CHOICES = {key: _choice(*key) for key in itertools.product((False, True), FpropKernel)}


def linear_gemm(module: FpropKernelSwitch) -> GemmChoice:
    """The GEMMs of an FP8 linear (`Fp8Linear`, `Fp8RolloutLinear`) now: its recipe and its `fprop_kernel`."""
    return choose_gemm(module.recipe, module.fprop_kernel)


def fprop_backend(module: FpropKernelSwitch) -> FpropBackend:
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
