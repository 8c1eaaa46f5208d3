"""The exact mode (`policy.generation.deterministic: true`): batch-invariant kernels for the rollout AND the trainer.

A token's logprob in the rollout comes from a decode step (one query per row, M = batch), or from the prefill, while
the trainer scores the whole sequence in micro-batches; with shape-dependent kernels the two round differently, and
in FP8 one last-bit difference before an activation quantizer can flip an e4m3 code. `enable_batch_invariant(model)`
switches every kernel on that path to one whose per-row result does not depend on the rest of the batch:

| part | kernel in the exact mode | batch-invariant because |
|---|---|---|
| FP8 linears (FProp) | `precision.batch_invariant.fp8_mm` | fixed K order and chunking, no shape-dependent split-K |
| other linears (lm_head, BF16 layers, BF16 MoE experts) | `precision.batch_invariant.linear` | fixed K order, no split-K |
| MoE routers (any part on: matched kernels too) | `precision.batch_invariant.linear` in FP32 | same logits bits, same experts |
| attention (decode, prefill, training) | `batch_invariant_attention` | one key-block order for every query |
| log-softmax of the logprobs | `logsumexp_rows` | one program per row, fixed steps |
| RMSNorm, q/k-norm + RoPE, SiLU*up (CUDA) | `fused_ops` / `fused_train_ops` as always | one program per row or token |

The switch lives on the model, which the trainer and the native rollout engine share, so the two sides cannot
disagree. On CPU the twins run (float64, batch-invariant there too). Backward passes keep the usual kernels.

`ExactParts` names the parts one by one; the exact mode switches all of them, the mismatch ablation
(`benchmarks/bench_mismatch.py --ablate`) subsets, passed explicitly to `enable_batch_invariant`;
`policy.generation.matched_kernels` (`match_kernels`) the cheap ones (`matched_parts`: on CUDA the attention, whose
logprob kernel is per-row already), with the FP8 GEMMs on cuBLAS at every M. Each switchable linear holds its
forward GEMM choice in one `fprop_kernel` (`precision.recipes.gemm_choice.FpropKernel`), which these switches set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from nemo_jetrl.precision import batch_invariant as bi_linear
from nemo_jetrl.precision.expert_linear import ExpertLinear, RouterLinear
from nemo_jetrl.precision.linear import Fp8Linear, FpropKernel
from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear

_PARTS_ATTR = "jetrl_exact_parts"  # the model attribute holding its ExactParts
LSE_REF_CHUNK = 4096  # vocabulary entries per float64 partial sum of the twin


@dataclass(frozen=True)
class ExactParts:
    """Which parts of the path from a token to its logprob run their exact (batch-invariant) form.

    fp8_gemm: the FP8 linears' forward GEMM (and an `Fp8Linear`'s BF16 path); linear: plain linears (lm_head);
    attention: decode, prefill and training attention, FP8 KV read included; logsumexp: the logprobs' log-sum-exp
    (sampler and trainer)."""

    fp8_gemm: bool = True
    linear: bool = True
    attention: bool = True
    logsumexp: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def none(cls) -> ExactParts:
        return cls(**dict.fromkeys(cls.names(), False))

    @classmethod
    def only(cls, *names: str) -> ExactParts:
        """These parts exact, the others on the fast path."""
        return cls.none().with_parts(names, True)

    def without(self, *names: str) -> ExactParts:
        """These parts back on the fast path."""
        return self.with_parts(names, False)

    def with_parts(self, names, value: bool) -> ExactParts:
        unknown = set(names) - set(self.names())
        if unknown:
            raise ValueError(f"unknown exact-mode parts {sorted(unknown)}; known: {list(self.names())}")
        return dataclasses.replace(self, **dict.fromkeys(names, value))

    @property
    def complete(self) -> bool:
        """Every part exact: the exact mode."""
        return all(getattr(self, name) for name in self.names())

    @property
    def any(self) -> bool:
        return any(getattr(self, name) for name in self.names())


NO_EXACT_PARTS = ExactParts.none()


# `policy.generation.matched_kernels`: the parts whose exact form costs the rollout little, with the FP8 GEMMs on
# cuBLAS at every M (no split-K decode kernel); docs/mismatch.md has the ablation behind the choice.
MATCHED_PARTS = ExactParts.only("attention", "logsumexp")


def matched_parts(device: torch.device) -> ExactParts:
    """The parts `match_kernels` switches on `device`: on CUDA the attention alone, because the fast path's logprob
    is already one program per row with a fixed reduction order on both sides (`models.logprob_kernels`, whose sums
    the sampler's fused kernel shares), and it reads the bf16 logits in place where the exact form copies them to
    float32; elsewhere `MATCHED_PARTS` (the CPU's `torch.logsumexp` makes no such promise)."""
    return MATCHED_PARTS.without("logsumexp") if device.type == "cuda" else MATCHED_PARTS


def match_kernels(model: nn.Module, device: torch.device) -> None:
    """`policy.generation.matched_kernels`: `matched_parts(device)` on both sides, and on a GPU where cuBLAS runs
    the blockwise FP8 recipe every FP8 forward GEMM there (`precision.convert.use_cublas_fprop`)."""
    from nemo_jetrl.precision.convert import use_cublas_fprop
    from nemo_jetrl.precision.gemm import gemm_backend

    enable_batch_invariant(model, matched_parts(device))
    has_fp8 = any(isinstance(m, (Fp8Linear, Fp8RolloutLinear)) for m in model.modules())
    if has_fp8 and gemm_backend(device) == "scaled_mm":
        use_cublas_fprop(model)


def unmatch_kernels(model: nn.Module) -> None:
    """Undo `match_kernels`: the fast path's attention, log-sum-exp and FP8 forward GEMM choice back (the
    `matched_kernels: auto` self-check's refusal)."""
    if exact_parts(model) not in (MATCHED_PARTS, matched_parts(torch.device("cuda"))):
        raise ValueError(f"unmatch_kernels: the model runs {exact_parts(model)}, not the matched kernels")
    for module in model.modules():
        if isinstance(module, (Fp8Linear, Fp8RolloutLinear)):
            module.fprop_kernel = module.fprop_kernel.with_cublas(False)
    delattr(model, _PARTS_ATTR)


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


def enable_batch_invariant(model: nn.Module, parts: ExactParts = ExactParts()) -> int:
    """Switch `model` (trainer and rollout alike) to the exact mode's kernels (`parts`: all of them by default;
    subsets for the mismatch ablation); returns the number of linears switched.

    Plain `nn.Linear`s become `BatchInvariantLinear`s (`parts.linear`); FP8 linears (`Fp8Linear`,
    `Fp8RolloutLinear`) take the batch-invariant forward GEMM (`parts.fp8_gemm`), high-precision MoE experts the
    batch-invariant linear (`parts.linear`), MoE routers their batch-invariant FP32 logits with any part (the
    experts a token goes to then match on both sides): each one's `fprop_kernel` (`FpropKernel.with_exact`: a
    part off turns only an exact GEMM back to auto, cuBLAS stays); each side's `ForwardPlan`
    (models/forward_plan.py: the attention, the logprobs' log-sum-exp) and the samplers read `exact_parts(model)`."""
    if not parts.any:
        raise ValueError("enable_batch_invariant: no exact-mode part selected")
    has_linear, switched = False, 0
    for name, module in list(model.named_modules()):
        if isinstance(module, (Fp8Linear, Fp8RolloutLinear)):
            has_linear = True
            module.fprop_kernel = module.fprop_kernel.with_exact(parts.fp8_gemm)
            switched += parts.fp8_gemm
        elif isinstance(module, RouterLinear):
            module.fprop_kernel = FpropKernel.BATCH_INVARIANT
        elif isinstance(module, ExpertLinear):
            has_linear = True
            module.fprop_kernel = module.fprop_kernel.with_exact(parts.linear)
            switched += parts.linear
        elif type(module) is nn.Linear:
            has_linear = True
            if parts.linear:
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                setattr(parent, child, BatchInvariantLinear.from_linear(module))
                switched += 1
    if not has_linear:
        raise ValueError(f"enable_batch_invariant: {type(model).__name__} has no linear layers to switch")
    setattr(model, _PARTS_ATTR, parts)
    return switched


def exact_parts(model: nn.Module) -> ExactParts:
    """The parts of `model` switched to their exact form (none unless `enable_batch_invariant` ran)."""
    return getattr(model, _PARTS_ATTR, NO_EXACT_PARTS)


def is_batch_invariant(model: nn.Module) -> bool:
    """Whether `model` runs the whole exact mode."""
    return exact_parts(model).complete


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
            from nemo_jetrl.models import batch_invariant_lse_kernel

            lse = batch_invariant_lse_kernel.row_logsumexp(x2)
        else:
            lse = logsumexp_ref(x2)
        lse = lse.reshape(x.shape[:-1])
        ctx.save_for_backward(x, lse)
        return lse

    @staticmethod
    def backward(ctx, grad):
        x, lse = ctx.saved_tensors
        return grad[..., None] * (x - lse[..., None]).exp()
