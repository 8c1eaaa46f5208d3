"""Clipped policy-gradient loss with off-policy importance-sampling correction (NeMo-RL ``ClippedPGLossFn``).

Per response token t (all tensors [B, S], `mask` 1 on generated tokens):

    r_t     = exp(logp_t - logp_old_t)                               PPO ratio (grad flows through logp only)
    r_t     = exp(mean_t'(logp_t' - logp_old_t'))                   with sequence_level_importance_ratios (GSPO)
    pg_t    = max(-A_t r_t, -A_t clip(r_t, 1 - ratio_clip_min, 1 + ratio_clip_max))
    pg_t    = min(pg_t, -A_t c)            where A_t < 0             dual clip, if ratio_clip_c = c is set
    w_t     = exp(logp_old_t - logp_gen_t), NaN/inf -> 0, detached   trainer-vs-rollout IS weight (then truncated)
    w       = exp(sum_t (logp_old_t - logp_gen_t)), one per sequence     with sequence_level_importance_ratios
    kl_t    = v_t * k(logp_t, logp_ref_t), k3 = exp(ref - logp) - (ref - logp) - 1 (k1 = logp - ref,
              k2 = (ref - logp)^2 / 2; input clamp 20 on ref - logp, output clamp 10 on kl_t)
    v_t     = exp(logp_t - sg(logp_t)) (value 1: adds the score-function gradient of on-policy samples), or
              exp(logp_t - logp_gen_t) with use_on_policy_kl_approximation (NeMo-RL "fix: KL backward")
    loss    = reduce(w_t pg_t) + beta * reduce(kl_t)

force_on_policy_ratio (NeMo-RL): logp_old := sg(logp_t), the current logprobs detached, wherever logp_old appears
(r_t = exp(logp_t - sg(logp_t)) = 1 with the gradient of logp_t; the IS weights compare them with the rollout's).

reduce: token_level_loss -> sum over masked tokens / normalizer (default: this batch's token count);
sequence level -> per-sequence token mean, summed / normalizer (default: sequences with >= 1 token). A trainer
passes the GLOBAL count as `normalizer` so micro-batch losses (and gradients) sum to the full-batch mean.

Settings: the validated `loss_fn` section (`LossConfig`); its rules and defaults (e.g. ratio_min
filled in: 0 for ``tis``, 1 / ratio otherwise) live in algorithms/config.py only.

Truncation (`truncated_importance_sampling_type`, active only with `use_importance_sampling_correction`):
- ``tis``: clamp w to [ratio_min, ratio];
- ``icepop``: w = 0 on tokens with w outside [ratio_min, ratio];
- ``seq-mask-tis``: w = 0 on whole sequences whose geometric-mean ratio exp(mean_t(logp_old - logp_gen))
  (NaN/inf log-ratios count as 0) lies outside [ratio_min, ratio]; kept sequences keep their RAW per-token w,
  untruncated (NeMo-RL: "non-truncated token IS correction").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nemo_jetrl.algorithms.mismatch import kl_estimator
from nemo_jetrl.config.typed import typed_section
from nemo_jetrl.policy.interfaces import TrainBatch, metrics_to_floats

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.config import LossConfig


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


# --------------------------------------------------------------------------- input checks
def _check_inputs(mask: torch.Tensor, advantages: torch.Tensor | None, **tensors: torch.Tensor | None) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(f"mask must be a [B, S] tensor, got {getattr(mask, 'shape', type(mask).__name__)}")
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.shape != mask.shape:
            raise ValueError(f"{name} must have the mask's shape {tuple(mask.shape)}, got {getattr(t, 'shape', t)}")
    b = mask.shape[0]
    if advantages is None:
        return
    if not isinstance(advantages, torch.Tensor) or not (advantages.shape == (b,) or advantages.shape == mask.shape):
        raise ValueError(
            f"advantages must be [B]={b} or [B, S]={tuple(mask.shape)}, got {getattr(advantages, 'shape', advantages)}"
        )


# --------------------------------------------------------------------------- importance weights
def _raw_weights(
    logp_old: torch.Tensor, logp_gen: torch.Tensor, m: torch.Tensor, dtype: torch.dtype, per_sequence: bool = False
) -> torch.Tensor:
    """w = exp(logp_old - logp_gen) per token, or exp(sum over the sequence's tokens) broadcast to them
    (`per_sequence`); NaN/inf -> 0, 0 off the mask. All [B, S]."""
    log_w = logp_old.detach().to(dtype) - logp_gen.detach().to(dtype)  # [B, S]
    if per_sequence:
        log_w = torch.where(m, log_w, torch.zeros_like(log_w)).sum(-1, keepdim=True).expand_as(log_w)
    w = torch.exp(log_w)
    w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.where(m, w, torch.zeros_like(w))


def _truncate(
    w: torch.Tensor, logp_old: torch.Tensor, logp_gen: torch.Tensor, m: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the configured truncation to raw weights w [B, S]; returns (weights, out-of-bounds [B, S] bool)."""
    kind = cfg.truncated_importance_sampling_type
    hi, lo = cfg.truncated_importance_sampling_ratio, cfg.truncated_importance_sampling_ratio_min
    if kind is None:
        return w, torch.zeros_like(m)
    if kind == "tis":
        oob = (w > hi) | (w < lo)
        return w.clamp(lo, hi), oob & m
    if kind == "icepop":
        keep = (w >= lo) & (w <= hi)
        return torch.where(keep, w, torch.zeros_like(w)), ~keep & m
    # seq-mask-tis: geometric-mean ratio per sequence over its masked tokens.
    log_ratio = torch.nan_to_num(logp_old.detach().to(w.dtype) - logp_gen.detach().to(w.dtype), 0.0, 0.0, 0.0)
    log_ratio = torch.where(m, log_ratio, torch.zeros_like(log_ratio))  # [B, S]
    n_tok = m.sum(-1).clamp_min(1)  # [B]
    geo_mean = torch.exp(log_ratio.sum(-1) / n_tok)  # [B]
    keep_seq = (geo_mean >= lo) & (geo_mean <= hi)  # [B]
    weights = w * keep_seq.unsqueeze(-1).to(w.dtype)
    return weights, ~keep_seq.unsqueeze(-1) & m


def importance_weights(
    logp_old: torch.Tensor, logp_gen: torch.Tensor, mask: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached IS weights [B, S] (0 off the mask) and the out-of-bounds mask [B, S] bool.

    Without `use_importance_sampling_correction` the weights are 1 on every response token and nothing is oob.
    """
    _check_inputs(mask, None, logp_old=logp_old, logp_gen=logp_gen)
    m = mask.bool()
    dtype = torch.promote_types(logp_old.dtype, torch.float32)
    if not cfg.use_importance_sampling_correction:
        return m.to(dtype), torch.zeros_like(m)
    raw = _raw_weights(logp_old, logp_gen, m, dtype, cfg.sequence_level_importance_ratios)
    return _truncate(raw, logp_old, logp_gen, m, cfg)


# --------------------------------------------------------------------------- reductions
def _reduce(values: torch.Tensor, m: torch.Tensor, token_level: bool, normalizer: Any) -> torch.Tensor:
    """values, m: [B, S] -> scalar, per the docstring's token / sequence reduction."""
    v = torch.where(m, values, torch.zeros_like(values))
    if token_level:
        denom = m.sum().clamp_min(1) if normalizer is None else normalizer
        return v.sum() / denom
    per_seq = v.sum(-1) / m.sum(-1).clamp_min(1)  # [B]
    denom = (m.sum(-1) > 0).sum().clamp_min(1) if normalizer is None else normalizer
    return per_seq.sum() / denom


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean of x [B, S] over m's tokens (0 without any): a 0-d tensor, no host sync."""
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp_min(1)


def _sampling_ratio(w: torch.Tensor, m: torch.Tensor, per_sequence: bool) -> torch.Tensor:
    """Mean IS weight over tokens, or over sequences (one weight each) with sequence-level ratios (0-d)."""
    if not per_sequence:
        return _masked_mean(w, m)
    per_seq = (w * m).sum(-1) / m.sum(-1).clamp_min(1)  # [B]: the sequence's weight (0 without tokens)
    return per_seq.sum() / m.any(-1).sum().clamp_min(1)


def _check_normalizer(normalizer: Any) -> None:
    """A number > 0, or a one-element floating tensor (its value is the caller's to check: reading it would sync
    the host with the device, and a captured training step passes its normalizer as a device tensor)."""
    if normalizer is None:
        return
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1 or not normalizer.is_floating_point():
            raise ValueError(f"a tensor normalizer must be one floating value, got {tuple(normalizer.shape)} "
                             f"{normalizer.dtype}")  # fmt: skip
        return
    if not _is_number(normalizer) or normalizer <= 0:
        raise ValueError(f"normalizer must be a number > 0 (the global token/sequence count), got {normalizer!r}")


# --------------------------------------------------------------------------- the loss
def clipped_pg_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_gen: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    logp_ref: torch.Tensor | None = None,
    normalizer: float | torch.Tensor | None = None,
    sync_metrics: bool = True,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped PG loss (see module docstring). logp [B, S] carries the grad; advantages [B] or [B, S].

    Padding (mask == 0) may hold any value, NaN included: it changes neither the loss nor the gradient.
    Metrics: ``loss`` follows the loss's normalization (sum it over micro-batches); every other metric is a mean
    over THIS call's tokens (``is_oob_ratio`` of seq-mask-tis: over its sequences), ``probs_ratio_min/max`` are
    extrema (+inf / -inf without tokens); ``kl_penalty`` is the KL before the coefficient. Floats, read in one
    host sync; with ``sync_metrics=False`` 0-d tensors on logp's device (no sync: a trainer reads them once per
    optimizer step, `metrics_to_floats`).
    """
    _check_inputs(mask, advantages, logp=logp, logp_old=logp_old, logp_gen=logp_gen, logp_ref=logp_ref)
    _check_normalizer(normalizer)
    if cfg.force_on_policy_ratio:
        logp_old = logp.detach()
    if cfg.reference_policy_kl_penalty != 0 and logp_ref is None:
        raise ValueError("logp_ref is required when loss_fn.reference_policy_kl_penalty != 0")
    m = mask.bool()  # [B, S]
    dtype = torch.promote_types(logp.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    # Sanitize padding before any exp so no NaN/inf enters the graph (a where() after exp still leaks NaN grads).
    cur = torch.where(m, logp.to(dtype), zero)  # [B, S]
    old = torch.where(m, logp_old.detach().to(dtype), zero)  # [B, S]
    adv = advantages.detach().to(dtype)
    adv = adv.unsqueeze(-1).expand_as(cur) if adv.dim() == 1 else adv  # [B, S]
    adv = torch.where(m, adv, zero)

    log_ratio = cur - old  # [B, S]
    if cfg.sequence_level_importance_ratios:  # GSPO: the sequence's mean log-ratio on each of its tokens
        seq = log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1)  # [B, 1]
        log_ratio = seq.expand_as(cur)
    ratio = torch.exp(log_ratio)  # [B, S]
    ratio_clamped = ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
    pg = torch.maximum(-adv * ratio, -adv * ratio_clamped)  # pessimistic of unclipped / clipped
    if cfg.ratio_clip_c is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.ratio_clip_c), pg)

    raw_w = _raw_weights(logp_old, logp_gen, m, dtype, cfg.sequence_level_importance_ratios)  # [B, S]
    trunc_w, oob = _truncate(raw_w, logp_old, logp_gen, m, cfg)
    w = trunc_w if cfg.use_importance_sampling_correction else m.to(dtype)
    loss = _reduce(w * pg, m, cfg.token_level_loss, normalizer)

    kl_value = zero
    if cfg.reference_policy_kl_penalty != 0:
        ref = torch.where(m, logp_ref.detach().to(dtype), zero)
        if cfg.use_on_policy_kl_approximation:
            gen = torch.where(m, logp_gen.detach().to(dtype), zero)
            kl_w = torch.nan_to_num(torch.exp(cur - gen), 0.0, 0.0, 0.0)
        else:
            kl_w = torch.exp(cur - cur.detach())  # value 1, gradient of the sampling probability
        kl_tok = kl_estimator(
            cur,
            ref,
            cfg.reference_policy_kl_type,
            input_clamp_value=cfg.kl_input_clamp_value,
            output_clamp_value=cfg.kl_output_clamp_value,
            weights=kl_w,
        )  # [B, S]
        loss = loss + cfg.reference_policy_kl_penalty * _reduce(kl_tok, m, cfg.token_level_loss, normalizer)
        kl_value = _reduce(kl_tok.detach(), m, cfg.token_level_loss, None)

    with torch.no_grad():
        r, rc = ratio.detach(), ratio_clamped.detach()
        entropy_w = torch.nan_to_num(torch.exp(cur.detach() - logp_gen.detach().to(dtype)), 0.0, 0.0, 0.0)
        if cfg.truncated_importance_sampling_type == "seq-mask-tis":
            has_tok = m.any(-1)
            oob_ratio = (oob.any(-1) & has_tok).sum() / has_tok.sum().clamp_min(1)
        else:
            oob_ratio = _masked_mean(oob.to(dtype), m)
        metrics = {
            "loss": loss.detach(),
            "kl_penalty": kl_value,
            "probs_ratio": _masked_mean(r, m),
            "probs_ratio_clamped": _masked_mean(rc, m),
            "probs_ratio_min": torch.where(m, r, math.inf).amin(),  # +inf without tokens
            "probs_ratio_max": torch.where(m, r, -math.inf).amax(),
            "clip_fraction": _masked_mean((r != rc).to(dtype), m),
            "approx_entropy": -_masked_mean(entropy_w * cur.detach(), m),
            "sampling_importance_ratio": _sampling_ratio(trunc_w, m, cfg.sequence_level_importance_ratios),
            "is_oob_ratio": oob_ratio,
            "num_valid_tokens": m.sum(),
            "num_valid_samples": m.any(-1).sum(),
        }
    return loss, (metrics_to_floats([metrics])[0] if sync_metrics else metrics)


@dataclass(frozen=True)
class ClippedPGLossFn:
    """NeMo-RL's `ClippedPGLossFn`: the `LossFunction` the GRPO driver hands to `PolicyInterface.train`.

    `cfg`: the validated `loss_fn` section, a `LossConfig` (it travels to the Ray workers, pickled, with the
    micro-batches).
    """

    cfg: LossConfig

    def __post_init__(self) -> None:
        typed_section(self.cfg, "LossConfig", "ClippedPGLossFn")

    def normalizer(self, batch: TrainBatch) -> float:
        """The global batch's token count (`token_level_loss`) or its count of sequences with a generated token."""
        mask = batch.response_mask.float()  # [B, S]
        count = mask.sum() if self.cfg.token_level_loss else (mask.sum(-1) > 0).sum()
        return max(float(count), 1.0)

    def __call__(
        self, logprobs: torch.Tensor, batch: TrainBatch, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's loss and metrics, 0-d tensors on the device (no host sync; `metrics_to_floats`)."""
        return clipped_pg_loss(
            logprobs,
            batch.prev_logprobs,
            batch.generation_logprobs,
            batch.advantages,
            batch.response_mask,
            self.cfg,
            logp_ref=batch.reference_logprobs,
            normalizer=normalizer,
            sync_metrics=False,
        )
