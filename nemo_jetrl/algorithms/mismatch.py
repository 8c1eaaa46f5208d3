"""Training-inference mismatch metrics (NeMo-RL names and estimators) and the Schulman KL estimators.

All metrics are means over generated tokens (`mask [B, S]`) of per-token quantities of
``d = logp_train - logp_gen`` (the trainer's logprob of the sampled token minus the rollout's):

- ``token_mult_prob_error = mean(exp(|d|))``          (1.0 = identical; acceptable < ~1.03-1.05)
- ``gen_kl_error          = mean(exp(d) - d - 1)``     k3 estimate of KL(gen || train) under gen samples
- ``policy_kl_error       = mean(exp(-d) + d - 1)``    k3 with the roles swapped, "KL(train || gen)"
- ``js_divergence_error   = mean(0.5 KL(train||M) + 0.5 KL(gen||M))`` with M = (p_train + p_gen) / 2, each KL a
  k3 term; per token it equals ``log((p + q) / (2 sqrt(p q)))``.
- ``exact_token_fraction``: share of those tokens whose two logprobs are bitwise equal (as float32).

``mismatch_by_position`` gives ``token_mult_prob_error`` per bin of response positions (position = how many
generated tokens of the row come before the token), to see whether mismatch grows along a long response.

This mirrors NeMo-RL's ``ClippedPGLossFn`` (``calculate_kl(logprobs=gen, logprobs_reference=train)`` for gen-kl,
swapped for policy-kl, with the configured ``reference_policy_kl_type``, k3 by default, and no clamping).
Importance-sampling metrics (``sampling_importance_ratio``, ``is_oob_ratio``) depend on the truncation config and
live with the loss (`loss.clipped_pg_loss`).

Robustness: masked tokens where either logprob is NaN/inf are left out of every mean and counted in
``num_nonfinite_tokens``; no NaN ever reaches the returned floats.
"""

from __future__ import annotations

import math

import torch

KL_TYPES = ("k1", "k2", "k3")
POSITION_DIGITS = 5  # mismatch_pos/<start>: the bin's first response position, zero-padded


def kl_estimator(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: str = "k3",
    *,
    input_clamp_value: float | None = None,
    output_clamp_value: float | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate with samples from `logprobs`' policy (Schulman 2020), logr = ref - logprobs:
    k1 = -logr, k2 = logr^2 / 2, k3 = exp(logr) - logr - 1. Optional symmetric clamps on logr and on the result.

    `weights` [B, S] (NeMo-RL's importance_sampling_weights) multiply the estimate before the output clamp; where
    the input clamp bites, their gradient is cut too."""
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type must be one of {KL_TYPES}, got {kl_type!r}")
    logr = logprobs_reference - logprobs  # [B, S]
    if input_clamp_value is not None:
        clamped = logr.clamp(-input_clamp_value, input_clamp_value)
        if weights is not None:
            weights = torch.where(logr == clamped, weights, weights.detach())
        logr = clamped
    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k2":
        kl = logr.square() / 2
    else:
        kl = torch.exp(logr) - logr - 1
    if weights is not None:
        kl = weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(-output_clamp_value, output_clamp_value)
    return kl


def _check_pair(logp_train: torch.Tensor, logp_gen: torch.Tensor, mask: torch.Tensor) -> None:
    for name, t in (("logp_train", logp_train), ("logp_gen", logp_gen), ("mask", mask)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a [B, S] tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if logp_train.shape != logp_gen.shape or logp_train.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: logp_train {tuple(logp_train.shape)}, logp_gen {tuple(logp_gen.shape)}, "
            f"mask {tuple(mask.shape)}"
        )


@torch.no_grad()
def mismatch_metrics(
    logp_train: torch.Tensor, logp_gen: torch.Tensor, mask: torch.Tensor, *, kl_type: str = "k3"
) -> dict[str, float]:
    """Trainer-vs-rollout logprob mismatch over generated tokens. All inputs [B, S]; returns python floats.

    With no usable token the errors take their no-mismatch values (1.0 for the multiplicative error, 0.0 else).
    """
    _check_pair(logp_train, logp_gen, mask)
    dtype = torch.promote_types(torch.promote_types(logp_train.dtype, logp_gen.dtype), torch.float32)
    train = logp_train.detach().to(dtype)  # [B, S]
    gen = logp_gen.detach().to(dtype)  # [B, S]
    m = mask.bool()
    finite = torch.isfinite(train) & torch.isfinite(gen)
    valid = m & finite  # [B, S]
    n_valid = int(valid.sum())
    n_nonfinite = int((m & ~finite).sum())
    if n_valid == 0:
        return {
            "token_mult_prob_error": 1.0,
            "gen_kl_error": 0.0,
            "policy_kl_error": 0.0,
            "js_divergence_error": 0.0,
            "exact_token_fraction": 1.0,
            "num_valid_tokens": 0.0,
            "num_nonfinite_tokens": float(n_nonfinite),
        }
    zero = torch.zeros((), dtype=dtype, device=train.device)
    train = torch.where(valid, train, zero)
    gen = torch.where(valid, gen, zero)

    def mean(x: torch.Tensor) -> float:
        return float(torch.where(valid, x, zero).sum() / n_valid)

    d = train - gen  # [B, S]
    log_mixture = torch.logaddexp(train, gen) - math.log(2.0)  # log((p + q) / 2)
    kl_train_to_mix = kl_estimator(log_mixture, train, "k3")  # exp(a) - a - 1, a = train - log_mixture
    kl_gen_to_mix = kl_estimator(log_mixture, gen, "k3")
    return {
        "token_mult_prob_error": mean(torch.exp(d.abs())),
        "gen_kl_error": mean(kl_estimator(gen, train, kl_type)),
        "policy_kl_error": mean(kl_estimator(train, gen, kl_type)),
        "js_divergence_error": mean(0.5 * kl_train_to_mix + 0.5 * kl_gen_to_mix),
        "exact_token_fraction": float((valid & (logp_train.float() == logp_gen.float())).sum()) / n_valid,
        "num_valid_tokens": float(n_valid),
        "num_nonfinite_tokens": float(n_nonfinite),
    }


@torch.no_grad()
def mismatch_by_position(
    logp_train: torch.Tensor, logp_gen: torch.Tensor, mask: torch.Tensor, bin_tokens: int
) -> dict[str, float]:
    """``token_mult_prob_error`` per bin of `bin_tokens` response positions: {"00000": ..., "00064": ...}, keyed by
    the bin's first position zero-padded to 5 digits (one name per bin in every step, up to 99,999 positions, so a
    16K-token run's bins keep their names whatever its longest response); bins with no usable token are left out.
    All inputs [B, S]."""
    _check_pair(logp_train, logp_gen, mask)
    if isinstance(bin_tokens, bool) or not isinstance(bin_tokens, int) or bin_tokens < 1:
        raise ValueError(f"bin_tokens must be an int >= 1, got {bin_tokens!r}")
    m = mask.bool()
    train, gen = logp_train.detach().double(), logp_gen.detach().double()  # [B, S]
    valid = m & torch.isfinite(train) & torch.isfinite(gen)  # [B, S]
    if not bool(valid.any()):
        return {}
    position = m.long().cumsum(dim=1) - 1  # [B, S] index of each generated token within its response
    bins = (position // bin_tokens)[valid]  # [N]
    err = torch.exp((train - gen).abs())[valid]  # [N]
    num_bins = int(bins.max()) + 1
    sums = torch.zeros(num_bins, dtype=err.dtype, device=err.device).index_add_(0, bins, err)  # [num_bins]
    counts = torch.bincount(bins, minlength=num_bins)  # [num_bins]
    width = max(POSITION_DIGITS, len(str((num_bins - 1) * bin_tokens)))
    return {f"{b * bin_tokens:0{width}d}": float(sums[b] / counts[b]) for b in range(num_bins) if int(counts[b]) > 0}


def step_mismatch_metrics(
    logp_train: torch.Tensor, logp_gen: torch.Tensor, mask: torch.Tensor, position_bin: int = 0
) -> dict[str, float]:
    """A GRPO step's trainer-vs-rollout metrics ([B, S] each): `mismatch_metrics`, plus `mismatch_pos/<start>` per bin
    of `position_bin` response positions when it is > 0 (`grpo.mismatch_position_bin`)."""
    metrics = mismatch_metrics(logp_train, logp_gen, mask)
    if position_bin > 0:
        by_position = mismatch_by_position(logp_train, logp_gen, mask, position_bin)
        metrics.update({f"mismatch_pos/{k}": v for k, v in by_position.items()})
    return metrics
