"""Activation checkpointing of the trainer's forward (`policy.dtensor_cfg.activation_checkpointing`, NeMo-RL's key).

Each decoder layer runs under `torch.utils.checkpoint` (non-reentrant): the forward keeps only the layer's input, the
residual sum made before the layer (`decoder.residual_sum`, one [T, H] tensor: the previous branch output is added
in, not kept beside the residual), and the backward runs the layer's forward again to rebuild what its backward
reads. The sum has the fused add + norm kernel's bits, and the norm then takes the residual's gradient into its
backward kernel as with the add (models/fused_train_ops.py): the same numbers as without checkpointing. With it on, the lm_head + logprob chunks are recomputed
too, so the [T, V] logits are not kept between the forward and the backward either.

Same numbers, bit for bit: the recomputed forward runs the same kernels on the same inputs, and every FP8 linear
reads the step's FP8 weight bits: cached (`Fp8Linear.quantized_weight`, keyed by the master weight's version:
nothing writes the weights between a forward and its backward) or, for the trainer's transient linears
(`precision.convert.use_transient_fp8_weights`), quantized again by the same deterministic cast and released after
the layer's forward and after its recomputation (`release`), so one layer's FP8 weights are alive at a time. The one
thing that must not run twice is an attention hook's side effect (the KV-scale calibrator observing Q/K/V): a hook
may carry `replay`, the same transform without the side effect (None: no transform), which the recomputation calls.
No RNG runs in the forward, so the RNG state is not saved (`preserve_rng_state=False`; also what a captured CUDA
graph needs: reading the generator's state is not allowed while capturing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


def recomputes(enabled: bool, kv_cache: object | None = None) -> bool:
    """Whether a forward recomputes its activations: asked for, building a graph (the trainer's backward), and not a
    cached (rollout) forward. No-grad passes (logprobs, calibration) keep nothing anyway."""
    return bool(enabled) and torch.is_grad_enabled() and kv_cache is None


def replay_hook(hook: Callable | None) -> Callable | None:
    """The attention hook a recomputed forward calls: `hook.replay` where the hook has side effects, else the hook."""
    return getattr(hook, "replay", hook)


def checkpoint_layer(
    layer_fn: Callable[[torch.Tensor, torch.Tensor | None, Callable | None], tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    delta: torch.Tensor | None,
    attn_hook: Callable | None,
    release: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`layer_fn(x, delta, attn_hook) -> (x, delta)` with its activations recomputed in the backward, where it runs
    with `replay_hook(attn_hook)`. x, delta: [B, S, H] (delta None before the first layer). `release()` runs after
    the forward and after the recomputation, also when torch stops a recomputation early (once it has every tensor
    the backward needs)."""
    hooks = {"now": attn_hook}

    @contextlib.contextmanager
    def releasing():
        try:
            yield
        finally:
            if release is not None:
                release()

    @contextlib.contextmanager
    def recomputing():
        hooks["now"] = replay_hook(attn_hook)
        with releasing():
            yield

    def run(x_in: torch.Tensor, delta_in: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return layer_fn(x_in, delta_in, hooks["now"])

    return checkpoint(
        run, x, delta, use_reentrant=False, preserve_rng_state=False,
        context_fn=lambda: (releasing(), recomputing()),
    )  # fmt: skip


def checkpoint_call(fn: Callable[..., torch.Tensor], *args) -> torch.Tensor:
    """`fn(*args)` with its activations recomputed in the backward (an lm_head + logprob chunk: its logits)."""
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
