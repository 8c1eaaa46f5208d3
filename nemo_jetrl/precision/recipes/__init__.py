"""FP8 scale layouts as objects: one per layout (blockwise, rowwise, tensorwise), registered by name.

`PrecisionRecipe.granularity` (`policy.fp8_cfg.fp8_recipe`) names a layout; `PrecisionRecipe.layout` is the object
that hands out its casts, its three GEMMs and its features (`base.ScaleLayout`). Which GEMM kernel runs each
product is chosen in one place, `gemm_choice`. Nothing outside this package compares layout names
(tests/unit/precision/test_scale_layouts.py holds that). A new layout: a `ScaleLayout` subclass in a module here,
registered below, and its name in `policy.fp8_cfg.fp8_recipe`'s Literal (precision/config.py).
"""

from nemo_jetrl.precision.recipes.axis import ROWWISE, TENSORWISE
from nemo_jetrl.precision.recipes.base import (
    LayoutFeatures,
    ScaleLayout,
    feature_names,
    layout_names,
    layouts_with,
    register_layout,
    scale_layout,
    unregister_layout,
)
from nemo_jetrl.precision.recipes.blockwise import BLOCKWISE
from nemo_jetrl.precision.recipes.gemm_choice import FpropKernel, GemmChoice, choose_gemm, linear_gemm

for _layout in (BLOCKWISE, ROWWISE, TENSORWISE):
    register_layout(_layout)

__all__ = [
    "BLOCKWISE",
    "FpropKernel",
    "GemmChoice",
    "LayoutFeatures",
    "ROWWISE",
    "ScaleLayout",
    "TENSORWISE",
    "choose_gemm",
    "feature_names",
    "layout_names",
    "layouts_with",
    "linear_gemm",
    "register_layout",
    "scale_layout",
    "unregister_layout",
]
