"""`Fp8Linear`: FP32 master weight, FP8 FProp/DGrad/WGrad for training and an FP8 forward for the rollout.

The trainer's forward and the rollout both run `fp8_linear_forward` on the same cached `QuantizedWeight` (one
quantization per optimizer step), so for the same input the two sides compute the same bits. With
`fprop_kernel` BATCH_INVARIANT (the exact mode, `models.batch_invariant`) the forward GEMM is the batch-invariant
one, so the bits also do not depend on how many rows share the product (decode, prefill, trainer micro-batch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from nemo_jetrl.precision.gemm import no_autocast
from nemo_jetrl.precision.quantized import (
    QuantizedInput,
    QuantizedWeight,
    save_with_weight,
    saved_with_weight,
)
from nemo_jetrl.precision.recipe import PrecisionRecipe
from nemo_jetrl.precision.recipes.gemm_choice import (  # noqa: F401  (fprop_backend, library_backend: public)
    FpropBackend,
    FpropKernel,
    FpropKernelSwitch,
    GemmChoice,
    fprop_backend,
    library_backend,
    linear_gemm,
)
from nemo_jetrl.utils.dtensor import local_tensor  # noqa: F401  (re-exported: the FP8 layers' shard view)

AUTO_GEMM = GemmChoice()  # no switch: the library GEMMs, device and shape deciding
# reference: the plain linear on the master weight whatever the flags (a BF16 referee's rollout of the same weights)
Mode = Literal["train", "rollout", "reference"]
_MODES = ("train", "rollout", "reference")


def output_dtype(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.dtype:
    """The autocast dtype when autocast is on for x's device type, else `dtype` (default: x's dtype)."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype if dtype is None else dtype


def fp8_linear_forward(
    x2: torch.Tensor,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None,
    recipe: PrecisionRecipe,
    out_dtype: torch.dtype,
    backend: FpropBackend = "auto",
) -> torch.Tensor:
    """Y [M, N] = Q(X) [M, K] @ Q(W)^T + bias in the recipe's layouts; the one FP8 forward of both sides."""
    with no_autocast(x2.device.type):
        x_fp8, x_scale = recipe.layout.input_quant(x2, recipe)  # [M, K], scale in the recipe's layout
        return qweight.layout.fprop(x_fp8, x_scale, qweight, bias, out_dtype, backend)


def master_weight_quant(w: torch.Tensor, recipe: PrecisionRecipe) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FProp weight cast of the master w [N, K] in the recipe's layout (one pass): (e4m3 [N, K], fp32 scale,
    int32 0-dim count of w's NaN / inf values); every `Fp8Linear` quantization goes through here."""
    return recipe.layout.weight_quant(w, recipe)


def quantized_input_forward(
    x: QuantizedInput,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None,
    out_features: int,
    backend: FpropBackend = "auto",
) -> torch.Tensor:
    """The FP8 rollout forward on an already-quantized input: [*lead, K] -> [*lead, N]."""
    with torch.no_grad(), no_autocast(x.data.device.type):
        y2 = qweight.layout.fprop(x.data, x.scale, qweight, bias, x.out_dtype, backend)  # [M, N]
    return y2.reshape(*x.lead_shape, out_features)


class WeightSource(Protocol):
    """FP8 bits of a whole weight kept elsewhere than in the layer (a rank holding a shard of the master):
    `quantized_weight()` gives them; `autograd_weight(local)` turns this rank's master shard into the [N, K] tensor
    `Fp8LinearFunction` differentiates (its gradient, whole, goes back to the shard)."""

    def quantized_weight(self) -> QuantizedWeight: ...

    def autograd_weight(self, local: torch.Tensor) -> torch.Tensor: ...


class Fp8LinearFunction(torch.autograd.Function):
    """Y = Q(X) Q(W)^T with FP8 DGrad and WGrad, every cast and GEMM the recipe's scale layout's (`recipe.layout`,
    precision/recipes/); the GEMM families are `gemm`'s (`recipes.gemm_choice`). Gradients leave in the dtypes of
    x / weight / bias.

    The forward also writes the WGrad operand Q(X^T) (the layout's cast along the tokens), which is what gets saved
    for backward: FP8 instead of the high-precision input, and the same bits WGrad would otherwise requantize.
    """

    @staticmethod
    def forward(
        ctx, x, weight, bias, qweight: QuantizedWeight, recipe: PrecisionRecipe, out_dtype, gemm=AUTO_GEMM,
        transient: bool = False,
    ):  # fmt: skip
        # x: [..., K]; weight: [N, K] master (its FProp bits live in qweight); bias: [N] or None;
        # transient: qweight kept as saved tensors (`quantized.save_with_weight`)
        x2 = x.reshape(-1, x.shape[-1])  # x2: [M, K]
        with no_autocast(x.device.type):
            x_fp8, x_scale, saved = train_input_quant(x2, recipe, ctx.needs_input_grad[1])
            y2 = qweight.layout.fprop(x_fp8, x_scale, qweight, bias, out_dtype, gemm.fprop)  # y2: [M, N]
        save_with_weight(ctx, saved, qweight, transient)
        keep_for_backward(ctx, recipe, gemm, weight, bias, x.shape, x.dtype)
        return y2.reshape(*x.shape[:-1], y2.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        saved, qweight = saved_with_weight(ctx)
        grads = fp8_linear_backward(ctx, grad_out, saved, qweight, *ctx.needs_input_grad[:3])
        return *grads, None, None, None, None, None


def train_input_quant(
    x2: torch.Tensor, recipe: PrecisionRecipe, need_wgrad: bool
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """The trainer's FP8 input casts of x2 [M, K]: (FProp X, its scale, what the backward keeps: X^T [K, MP] along the
    M tokens, zero-padded, and its scale when WGrad runs, else nothing), one read of x2."""
    if need_wgrad:
        x_fp8, x_scale, xt_fp8, xt_scale = recipe.layout.input_quant_train(x2, recipe)
        return x_fp8, x_scale, (xt_fp8, xt_scale)
    x_fp8, x_scale = recipe.layout.input_quant(x2, recipe)
    return x_fp8, x_scale, ()


def keep_for_backward(ctx, recipe: PrecisionRecipe, gemm: GemmChoice, weight, bias, x_shape, x_dtype) -> None:
    """What `fp8_linear_backward` reads from ctx beside the saved tensors (weight: the master [N, K], bias: [N] or
    None, x_shape / x_dtype: the linear's input's)."""
    ctx.recipe, ctx.gemm, ctx.master = recipe, gemm, weight
    ctx.x_shape, ctx.x_dtype, ctx.weight_dtype = x_shape, x_dtype, weight.dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None


def fp8_linear_backward(
    ctx, grad_out: torch.Tensor, saved: tuple[torch.Tensor, ...], qweight: QuantizedWeight, need_dx, need_dw, need_db
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dX [*x_shape], dW [N, K], db [N]) of Y = Q(X) Q(W)^T from dY [..., N]: FP8 DGrad and WGrad in the recipe's
    layouts. ctx carries what `keep_for_backward` put there; saved: X^T and its scale."""
    recipe = ctx.recipe
    layout = recipe.layout
    dy2 = grad_out.reshape(-1, grad_out.shape[-1])  # dy2: [M, N]
    grad_x = grad_w = grad_b = None
    with no_autocast(grad_out.device.type):
        # dY read once: [M, N] along N (DGrad) and, when WGrad runs, dY^T: [N, MP] along the tokens
        dy_fp8, dy_scale, dyt_fp8, dyt_scale = layout.grad_quant(dy2, recipe, need_dx, need_dw)
        # grad_input (DGrad): dX [M, K] = Q(dY) [M, N] @ Q(W^T) [K, N]^T
        if need_dx:
            wt = layout.dgrad_weight(qweight, ctx.master, recipe)  # W^T [K, N]: the layout's DGrad operand
            grad_x = layout.dgrad(dy_fp8, dy_scale, wt, ctx.x_dtype, recipe, ctx.gemm.dgrad).reshape(ctx.x_shape)
        # grad_weight (WGrad): dW [N, K] = Q(dY^T) [N, MP] @ Q(X^T) [K, MP]^T, contraction over the tokens
        if need_dw:
            xt_fp8, xt_scale = saved
            grad_w = layout.wgrad(dyt_fp8, dyt_scale, xt_fp8, xt_scale, ctx.weight_dtype, recipe)
        # grad_bias: plain FP32 reduction over tokens
        if ctx.bias_dtype is not None and need_db:
            grad_b = dy2.float().sum(0).to(ctx.bias_dtype)
    return grad_x, grad_w, grad_b


class Fp8Linear(FpropKernelSwitch, nn.Module):
    """Linear layer with a master `weight` [N, K] (+ bias) that runs its GEMMs in FP8 (the recipe's scale layout).

    mode "train": FP8 autograd if `train_fp8`; mode "rollout": FP8 forward without autograd if `rollout_fp8`;
    otherwise, and always in mode "reference", a plain `F.linear`. Output dtype: the autocast dtype when autocast
    is on, else x's dtype.
    `fprop_kernel` (`FpropKernel`, precision/recipes/gemm_choice.py): how the forward GEMM is chosen.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        recipe: PrecisionRecipe | None = None,
        train_fp8: bool = True,
        rollout_fp8: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.recipe = recipe if recipe is not None else PrecisionRecipe.preset("jetrl")
        self.train_fp8, self.rollout_fp8 = bool(train_fp8), bool(rollout_fp8)
        self.mode = "train"
        # the trainer quantizes this layer's FP8 weight as the layer runs and drops it after (activation
        # checkpointing: `convert.use_transient_fp8_weights`); its backward keeps the bits as saved tensors
        self.transient_weight = False
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        if self.weight.device.type != "meta":
            nn.init.kaiming_uniform_(self.weight, a=5**0.5)
            if self.bias is not None:
                bound = 1.0 / in_features**0.5 if in_features > 0 else 0.0
                nn.init.uniform_(self.bias, -bound, bound)
        self._qweight: QuantizedWeight | None = None
        self._qweight_key: tuple | None = None
        self.weight_group = None  # an `Fp8WeightGroup` holding this layer's FP8 weight in a shared buffer, if any
        # Row-parallel (tensor parallel): the training GEMM returns its partial sums in this dtype (fp32) so that
        # the TP all-reduce adds them before the one rounding to the output dtype. None: the output dtype.
        self.partial_dtype: torch.dtype | None = None
        # Where the FP8 bits come from when this rank holds only a shard of the master (`WeightSource`, set by
        # `policy.parallel.fp8_gather`): None = quantized here from `weight`.
        self.weight_source: WeightSource | None = None

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        recipe: PrecisionRecipe,
        train_fp8: bool | None = None,
        rollout_fp8: bool | None = None,
    ) -> Fp8Linear:
        """Wrap an `nn.Linear`, moving its Parameter objects in (no copy). Flags default to the recipe's."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"Fp8Linear.from_linear expects an nn.Linear, got {type(linear).__name__}")
        module = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            recipe=recipe,
            train_fp8=recipe.train_fp8 if train_fp8 is None else train_fp8,
            rollout_fp8=recipe.rollout_fp8 if rollout_fp8 is None else rollout_fp8,
            device="meta",
        )
        module.weight = linear.weight
        module.bias = linear.bias
        return module

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, value: Mode) -> None:
        if value not in _MODES:
            raise ValueError(f"Fp8Linear.mode must be one of {_MODES}, got {value!r}")
        self._mode = value

    @property
    def fp8_rollout_active(self) -> bool:
        """Whether the forward is the FP8 rollout one now (so it also takes a `QuantizedInput`)."""
        return self.mode == "rollout" and self.rollout_fp8

    def weight_key(self) -> tuple:
        """What the cached FP8 weight depends on: the master weight's version, storage, shape, dtype; scale rule.
        Under tensor parallel (a DTensor weight) all of it is this rank's shard's."""
        w = local_tensor(self.weight)
        return (w._version, w.data_ptr(), w.device, w.dtype, tuple(w.shape), self.recipe.pow2_weight_scales)

    def quantize_weight(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fresh (e4m3 [N, K], fp32 scale, int32 non-finite count) of the master weight in the recipe's weight
        layout (one pass); of this rank's shard [N/tp, K] or [N, K/tp] under tensor parallel (blockwise: its
        tiles never straddle a shard boundary)."""
        with torch.no_grad():
            return master_weight_quant(local_tensor(self.weight).detach(), self.recipe)

    @property
    def cached_quantized_weight(self) -> QuantizedWeight | None:
        """The FP8 weight held now, as it is (None before the first quantization); `quantized_weight()` refreshes."""
        return self._qweight

    def quantized_weight(self) -> QuantizedWeight:
        """The FP8 weight, re-quantized only when the master weight changed (version, storage, shape, dtype); the
        `weight_source`'s where one is set."""
        if self.weight_source is not None:
            return self.weight_source.quantized_weight()
        if self.weight_group is not None:  # the group re-quantizes its members together into one buffer
            self.weight_group.refresh()
        key = self.weight_key()
        if self._qweight is None or key != self._qweight_key:
            data, scale, nonfinite = self.quantize_weight()
            self.set_quantized_weight(data, scale, key, nonfinite)
        return self._qweight

    def set_quantized_weight(
        self, data: torch.Tensor, scale: torch.Tensor, key: tuple, nonfinite: torch.Tensor | None = None
    ) -> None:
        """Cache (data, scale) as the FP8 weight for master-weight state `key` (a `weight_key()`)."""
        self._qweight = QuantizedWeight(data, scale, key[0], self.recipe.block_size, nonfinite, self.recipe.layout)
        self._qweight_key = key

    def requantize_in_place(self) -> None:
        """Re-quantize the master weight into the cached FP8 tensors themselves (`QuantizedWeight.refill`), the
        group's shared buffer for a grouped layer; a fresh cache where none is held or the master weight's storage,
        shape or dtype changed (a captured step that read the old tensors then sees them replaced)."""
        if self.weight_group is not None:
            self.weight_group.requantize_in_place()
            return
        key = self.weight_key()
        if self._qweight is None or self._qweight_key is None or key[1:] != self._qweight_key[1:]:
            self.invalidate_quantized_weight()
            self.quantized_weight()
            return
        data, scale, nonfinite = self.quantize_weight()
        self._qweight.refill(data, scale, nonfinite)
        self._qweight_key = key
        self.refill_dgrad_weight()

    def refill_dgrad_weight(self) -> None:
        """A cached DGrad operand made apart from the FProp bits (rowwise's second cast), re-made in place from the
        new weight after `QuantizedWeight.refill` (which refills the transposed FProp bits itself)."""
        if self._qweight is not None:
            self.recipe.layout.refill_dgrad_weight(self._qweight, local_tensor(self.weight), self.recipe)

    def invalidate_quantized_weight(self) -> None:
        """Drop the cache (for weight writes that bypass the version counter, e.g. through `.data`)."""
        self._qweight, self._qweight_key = None, None
        if self.weight_group is not None:
            self.weight_group.invalidate()

    def forward(self, x: torch.Tensor | QuantizedInput) -> torch.Tensor:
        if isinstance(x, QuantizedInput):
            if not self.fp8_rollout_active or x.data.shape[-1] != self.in_features:
                raise ValueError("Fp8Linear: a QuantizedInput is only for FP8 rollout mode with matching in_features")
            bias = local_tensor(self.bias)
            return quantized_input_forward(x, self.quantized_weight(), bias, self.out_features, linear_gemm(self).fprop)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Fp8Linear: expected input [..., {self.in_features}], got {tuple(x.shape)}")
        use_fp8 = (self.mode == "train" and self.train_fp8) or (self.mode == "rollout" and self.rollout_fp8)
        if not use_fp8:
            return self._plain_linear(x)
        out_dtype = output_dtype(x)
        qweight, gemm = self.quantized_weight(), linear_gemm(self)
        if self.mode == "rollout":
            with torch.no_grad():
                bias = local_tensor(self.bias)
                x2 = x.reshape(-1, self.in_features)
                y2 = fp8_linear_forward(x2, qweight, bias, self.recipe, out_dtype, gemm.fprop)
            return y2.reshape(*x.shape[:-1], self.out_features)
        weight, bias = self.train_operands()
        out_dtype = self.partial_dtype or out_dtype
        return Fp8LinearFunction.apply(x, weight, bias, qweight, self.recipe, out_dtype, gemm, self.transient_weight)

    def train_operands(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight [N, K], bias [N] or None) as the FP8 training functions take them: this rank's local tensors, the
        weight as the whole weight's stand-in where a `weight_source` holds it (its gradient goes to this shard)."""
        weight, bias = local_tensor(self.weight), local_tensor(self.bias)
        if self.weight_source is not None:
            weight = self.weight_source.autograd_weight(weight)
        return weight, bias

    def _plain_linear(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = local_tensor(self.weight), local_tensor(self.bias)
        if self.exact_fprop:
            from nemo_jetrl.precision import batch_invariant

            return batch_invariant.linear(x, weight, bias)
        if torch.is_autocast_enabled(x.device.type):
            return F.linear(x, weight, bias)  # autocast casts, as for nn.Linear
        bias = bias.to(x.dtype) if bias is not None else None
        return F.linear(x, weight.to(x.dtype), bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"train_fp8={self.train_fp8}, rollout_fp8={self.rollout_fp8}, mode={self.mode}"
        )


def rollout_mode(model: nn.Module) -> contextlib.AbstractContextManager[nn.Module]:
    """Set `mode="rollout"` on every Fp8Linear of `model` for the block; restore the previous modes after."""
    return linear_mode(model, "rollout")


@contextlib.contextmanager
def linear_mode(model: nn.Module, mode: Mode) -> Iterator[nn.Module]:
    """Set `mode` on every Fp8Linear of `model` for the block; restore the previous modes after."""
    modules = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    previous = [m.mode for m in modules]
    for m in modules:
        m.mode = mode
    try:
        yield model
    finally:
        for m, mode in zip(modules, previous):
            m.mode = mode
