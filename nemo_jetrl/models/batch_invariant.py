"""The exact mode (`policy.generation.deterministic: true`): batch-invariant kernels for the rollout AND the trainer.

A token's logprob in the rollout comes from a decode step (one query per row, M = batch), or from the prefill, while
the trainer scores the whole sequence in micro-batches; with shape-dependent kernels the two round differently, and
in FP8 one last-bit difference before an activation quantizer can flip an e4m3 code. `enable_batch_invariant(model)`
switches every kernel on that path to one whose per-row result does not depend on the rest of the batch:

| part | kernel in the exact mode | batch-invariant because |
|---|---|---|
| FP8 linears (FProp) | `precision.batch_invariant.fp8_mm` | fixed K order and chunking, no shape-dependent split-K |
| other linears (lm_head, BF16 layers) | `precision.batch_invariant.linear` | fixed K order, no split-K |
| attention (decode, prefill, training) | `batch_invariant_attention` | one key-block order for every query |
| log-softmax of the logprobs | `logsumexp_rows` | one program per row, fixed steps |
| RMSNorm, q/k-norm + RoPE, SiLU*up (CUDA) | `fused_ops` / `fused_train_ops` as always | one program per row or token |

The switch lives on the model, which the trainer and the native rollout engine share, so the two sides cannot
disagree. On CPU the twins run (float64, batch-invariant there too). Backward passes keep the usual kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_jetrl.precision import batch_invariant as bi_linear
from nemo_jetrl.precision.linear import Fp8Linear
from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear

_FLAG = "jetrl_batch_invariant"
LSE_REF_CHUNK = 4096  # vocabulary entries per float64 partial sum of the twin


class BatchInvariantLinear(nn.Linear):
    """`nn.Linear` whose forward is `precision.batch_invariant.linear` (same parameters, same autocast rule)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> BatchInvariantLinear:
        """Wrap `linear`, moving its Parameter objects in (no copy; tied weights stay tied)."""
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        module.weight, module.bias = linear.weight, linear.bias
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bi_linear.linear(x, self.weight, self.bias)


def enable_batch_invariant(model: nn.Module) -> int:
    """Switch `model` (trainer and rollout alike) to the exact mode's kernels; returns the number of linears switched.

    Plain `nn.Linear`s become `BatchInvariantLinear`s; FP8 linears (`Fp8Linear`, `Fp8RolloutLinear`) take the
    batch-invariant forward GEMM; `decoder_forward` and the samplers read `is_batch_invariant(model)`."""
    switched = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, (Fp8Linear, Fp8RolloutLinear)):
            module.batch_invariant = True
            switched += 1
        elif type(module) is nn.Linear:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, BatchInvariantLinear.from_linear(module))
            switched += 1
    if switched == 0:
        raise ValueError(f"enable_batch_invariant: {type(model).__name__} has no linear layers to switch")
    setattr(model, _FLAG, True)
    return switched


def is_batch_invariant(model: nn.Module) -> bool:
    return bool(getattr(model, _FLAG, False))


def logsumexp_rows(x: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x), -1)) of float32 x [..., V] -> [...], batch-invariant; differentiable (softmax gradient)."""
    if x.dtype != torch.float32:
        raise ValueError(f"logsumexp_rows takes float32 logits, got {x.dtype}")
    return _LogSumExp.apply(x)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(tokens [...]) under softmax(logits [..., V] / temperature): `logit - logsumexp_rows`, float32."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, tokens[..., None]).squeeze(-1) - logsumexp_rows(scaled)


def logsumexp_ref(x2: torch.Tensor) -> torch.Tensor:
    """The twin: x2 [R, V] -> [R]; float64 max, then float64 sums of exp over fixed LSE_REF_CHUNK-wide chunks."""
    x64 = x2.double()
    top = x64.amax(-1, keepdim=True)  # [R, 1]
    shifted = (x64 - top).exp()
    total = torch.zeros(x2.shape[0], dtype=torch.float64, device=x2.device)
    for lo in range(0, x2.shape[1], LSE_REF_CHUNK):
        total = total + shifted[:, lo : lo + LSE_REF_CHUNK].sum(-1)
    return (top[:, 0] + total.log()).float()


class _LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        if x.is_cuda:
            from nemo_jetrl.models import batch_invariant_kernels

            lse = batch_invariant_kernels.row_logsumexp(x2)
        else:
            lse = logsumexp_ref(x2)
        lse = lse.reshape(x.shape[:-1])
        ctx.save_for_backward(x, lse)
        return lse

    @staticmethod
    def backward(ctx, grad):
        x, lse = ctx.saved_tensors
        return grad[..., None] * (x - lse[..., None]).exp()
