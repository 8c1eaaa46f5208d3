"""What stops a training step before the optimizer touches the weights: the errors, and the checks of the FP8
weights, the step's metrics and the model state they name (the one-process trainer, `policy/native.py`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from nemo_jetrl.precision import Fp8Linear, fp8_layers
from nemo_jetrl.precision.kv import KVScales
from nemo_jetrl.utils.checkpoint import first_nonfinite
from nemo_jetrl.utils.dtensor import local_tensor


class NonFiniteError(FloatingPointError):
    """A non-finite loss, gradient or FP8 weight/scale stopped a training step before the optimizer touched weights.

    `tensor` names the offending tensor (e.g. "gradient of model.layers.0.mlp.up_proj.weight").
    """

    def __init__(self, tensor: str, step: int) -> None:
        self.tensor, self.step = tensor, step
        super().__init__(f"non-finite {tensor} at trainer step {step}; optimizer step skipped, weights untouched")


class NonFiniteStateError(NonFiniteError):
    """Master weights, FP8 weight scales or KV scales are non-finite after a step: the run stops (nothing to skip
    back to); checkpoints saved before are untouched and a resume starts from the newest."""

    def __init__(self, tensor: str, step: int) -> None:
        self.tensor, self.step = tensor, step
        FloatingPointError.__init__(
            self, f"non-finite {tensor} after trainer step {step}; not saved, not sent to the rollout"
        )


class NonFiniteStreakError(NonFiniteError):
    """`grpo.max_consecutive_nonfinite_skips` GRPO steps in a row were skipped as non-finite: the run stops (a
    learning rate that blew the weights up, rewards or data that are never finite)."""

    def __init__(self, count: int, step: int) -> None:
        self.tensor, self.step = "steps", step
        FloatingPointError.__init__(
            self,
            f"{count} steps in a row skipped as non-finite (the last: step {step}); the run stops "
            f"(grpo.max_consecutive_nonfinite_skips={count}): lower policy.optimizer.lr or check the rewards and data",
        )


def _fp8_ok_flags(model: nn.Module) -> tuple[list[tuple[str, Fp8Linear]], list[torch.Tensor], list[torch.Tensor]]:
    """The FP8 layers and, per layer, its FP8 scales are finite / its master weight is finite (0-d device bools).

    The quantizer ignores NaN for the amax and saturates inf, so a bad master weight can hide behind finite
    scales: both are checked, the master weight through the non-finite count its quantization pass took.
    """
    layers = fp8_layers(model)
    qweights = [m.quantized_weight() for _, m in layers]
    scale_ok = [qw.scale.isfinite().all() for qw in qweights]
    weight_ok = [
        qw.nonfinite == 0 if qw.nonfinite is not None else local_tensor(m.weight).isfinite().all()
        for qw, (_, m) in zip(qweights, layers)
    ]
    return layers, scale_ok, weight_ok


def fp8_weights_finite(model: nn.Module) -> torch.Tensor | None:
    """0-d bool: every FP8 layer's scales and master weight are finite (no host sync); None without FP8.
    The same verdict as `_fp8_ok_flags` in a few launches whatever the depth (one over every scale, one over the
    quantizers' non-finite counts), not several per layer: each launch costs host time the device may wait for."""
    layers = fp8_layers(model)
    if not layers:
        return None
    qweights = [m.quantized_weight() for _, m in layers]
    ok = torch.cat([qw.scale.reshape(-1) for qw in qweights]).isfinite().all()
    counts = [qw.nonfinite for qw in qweights if qw.nonfinite is not None]  # int32 0-d each
    if counts:
        ok = ok & (torch.stack(counts).sum() == 0)
    for qw, (_, m) in zip(qweights, layers):
        if qw.nonfinite is None:  # a cache made without a count: the master weight itself
            ok = ok & local_tensor(m.weight).isfinite().all()
    return ok


def _first_nonfinite_fp8_weight(model: nn.Module) -> str:
    """Name of the first FP8 layer whose FP8 scale or master weight is non-finite (after `fp8_weights_finite` said
    one is)."""
    layers, scale_ok, weight_ok = _fp8_ok_flags(model)
    for (name, _), s_ok, w_ok in zip(layers, scale_ok, weight_ok):
        if not bool(s_ok):
            return f"FP8 weight scale of {name}"
        if not bool(w_ok):
            return f"master weight of FP8 layer {name}"
    return "an FP8 weight"


def first_nonfinite_in_step(
    model: nn.Module, checks: list[dict[str, float]], step_checks: dict[str, float]
) -> str | None:
    """What stops the step, first of: a non-finite FP8 weight (`step_checks["fp8_ok"]`), trainer logprob or
    micro-batch loss (`checks`, one dict per micro-batch), gradient norm; None when all are finite."""
    if step_checks.get("fp8_ok", 1.0) != 1.0:
        return _first_nonfinite_fp8_weight(model)
    for i, c in enumerate(checks):
        if c.get("bad_logps"):
            return f"trainer logprobs ({int(c['bad_logps'])} of {int(c['valid'])} generated tokens)"
        if not math.isfinite(c["loss"]):
            return f"loss (micro-batch {i}, value {c['loss']})"
    grad_norm = step_checks["grad_norm"]
    if not math.isfinite(grad_norm):
        name = next(
            (
                n
                for n, p in model.named_parameters()
                if p.grad is not None and not local_tensor(p.grad).isfinite().all()
            ),
            "gradient norm",
        )
        return f"gradient of {name} (grad norm {grad_norm})"
    return None


def nonfinite_model_state(model: nn.Module, kv_scales: KVScales | None) -> str | None:
    """Name of the first non-finite master weight, cached FP8 weight scale or KV scale, else None: one fused
    max-|x| reduction over all of them (one device sync)."""
    named = {f"master weight {n}": local_tensor(p.detach()) for n, p in model.named_parameters()}
    named.update({f"FP8 weight scale of {n}": m.quantized_weight().scale for n, m in fp8_layers(model)})
    if kv_scales is not None:
        named.update({f"KV {n} scales": getattr(kv_scales, n) for n in ("q", "k", "v")})
    return first_nonfinite(named)
