"""An independent trainer step to hold `NativePolicy.train` (and the FSDP trainer) against.

Plain autograd over an FP32 copy of the HF model through HF's own forward (eager attention, not the project's
decoder), the clipped PG loss written out token by token with the project's token-level normalisation (sum over
every response token of the GLOBAL batch / their count), `torch.nn.utils.clip_grad_norm_` and `torch.optim.AdamW`.
Nothing here imports the project's loss, decoder or optimizer code.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from nemo_jetrl.policy.interfaces import TrainBatch


def make_batch(vocab: int, seed: int, prompt_lens: list[int], resp_lens: list[int], seq: int) -> TrainBatch:
    """Left-padded prompts, right-padded responses, random tokens in [3, vocab); advantages ~ N(0, 1);
    rollout logprobs random. prev_logprobs are left for the caller (the policy's, perturbed)."""
    gen = torch.Generator().manual_seed(seed)
    b = len(prompt_lens)
    ids = torch.zeros(b, seq, dtype=torch.long)
    attn = torch.zeros(b, seq, dtype=torch.long)
    resp = torch.zeros(b, seq, dtype=torch.long)
    width = max(prompt_lens)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        ids[i, width - p : width + r] = torch.randint(3, vocab, (p + r,), generator=gen)
        attn[i, width - p : width + r] = 1
        resp[i, width : width + r] = 1
    adv = torch.randn(b, generator=gen)
    gen_lp = -torch.rand(b, seq, generator=gen) * 3 * resp
    return TrainBatch(ids, attn, resp, adv, gen_lp)


def hf_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """logp[b, t] = log_softmax(logits[b, t-1] / T)[ids[b, t]] on response tokens, 0 elsewhere; [B, S] fp32."""
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # [B, S-1, V]
    tok = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # [B, S-1]
    tok = torch.cat([torch.zeros_like(tok[:, :1]), tok], dim=1)  # [B, S]
    return tok * batch.response_mask


def clipped_pg_token_loss(
    logp: torch.Tensor, batch: TrainBatch, clip_lo: float, clip_hi: float, kl_beta: float = 0.0
) -> torch.Tensor:
    """sum over response tokens of max(-A r, -A clip(r, 1-lo, 1+hi)) [+ beta * k3 KL] / number of response tokens."""
    total = logp.new_zeros(())
    count = 0
    for b in range(len(batch)):
        a = float(batch.advantages[b])
        for t in torch.nonzero(batch.response_mask[b]).flatten().tolist():
            ratio = torch.exp(logp[b, t] - float(batch.prev_logprobs[b, t]))
            total = total + torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip_lo, 1 + clip_hi))
            if kl_beta:
                d = float(batch.reference_logprobs[b, t]) - logp[b, t]
                total = total + kl_beta * (torch.exp(d) - d - 1)
            count += 1
    return total / count


@dataclass
class ReferenceStep:
    """Pre-clip global grad norm, the clipped gradients and the parameters after each AdamW step, by name."""

    grad_norms: list[float]
    grads: list[dict[str, torch.Tensor]]
    params: list[dict[str, torch.Tensor]]


def reference_steps(
    model: torch.nn.Module, batches: list[TrainBatch], opt: dict, max_grad_norm: float | None, clip=(0.2, 0.2)
) -> ReferenceStep:
    """One AdamW step per batch on an FP32 copy of `model` (left untouched); `opt` = policy.optimizer keys."""
    ref = copy.deepcopy(model).float().train()
    ref.set_attn_implementation("eager")  # masked rows stay finite (SDPA may give NaN on all-pad query rows)
    params = dict(ref.named_parameters())
    adamw = torch.optim.AdamW(
        params.values(), lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=opt["weight_decay"]
    )
    out = ReferenceStep([], [], [])
    for batch in batches:
        adamw.zero_grad(set_to_none=True)
        clipped_pg_token_loss(hf_logprobs(ref, batch), batch, *clip).backward()
        norm = torch.nn.utils.clip_grad_norm_(
            [p for p in params.values() if p.grad is not None], max_grad_norm or float("inf")
        )
        out.grad_norms.append(float(norm))
        out.grads.append({n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None})
        adamw.step()
        out.params.append({n: p.detach().clone() for n, p in params.items()})
    return out
