"""NeMo-RL loss options with hand-derived values: GSPO sequence-level ratios and the k1/k2/k3 KL estimators."""

import math

import pytest
import torch

from nemo_jetrl.algorithms.config import LossConfig
from nemo_jetrl.algorithms.loss import clipped_pg_loss

F64 = torch.float64
LN2, LN3 = math.log(2.0), math.log(3.0)
# Row 0: 2 response tokens, A = +1. Row 1: 1 response token + 1 padding column, A = -1.
MASK = torch.tensor([[1, 1], [1, 0]])
ADV = torch.tensor([1.0, -1.0], dtype=F64)
OLD = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=F64)


def _seq_cfg(**kw):
    return LossConfig(token_level_loss=False, sequence_level_importance_ratios=True, **kw)


def test_sequence_level_ratio_is_the_geometric_mean_of_token_ratios():
    # Row 0 token log-ratios ln2, 0 -> mean ln2/2, r = sqrt(2) = 1.414 > 1.2: clipped (pg = -1.2, no gradient).
    # Row 1: log-ratio -ln(1.1) -> r = 1/1.1 = 0.909 in [0.8, 1.2]: pg = -A r = 0.909, d pg / d logp = r.
    # Sequence-level loss: mean over sequences of each sequence's token mean = (-1.2 + 1/1.1) / 2.
    logp = (OLD + torch.tensor([[LN2, 0.0], [-math.log(1.1), 0.0]], dtype=F64)).requires_grad_()
    loss, m = clipped_pg_loss(logp, OLD, OLD.clone(), ADV, MASK, _seq_cfg())
    loss.backward()
    assert loss.item() == pytest.approx((-1.2 + 1 / 1.1) / 2, rel=1e-12)
    assert m["probs_ratio"] == pytest.approx((2 * math.sqrt(2) + 1 / 1.1) / 3, rel=1e-12)  # every token holds r
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0], [1 / 1.1 / 2, 0.0]], dtype=F64))


def test_sequence_level_ratio_gradient_spreads_over_the_sequence_tokens():
    # Unclipped row 0 (log-ratios 0.1, -0.1 -> r = 1): pg = -r per token, token mean -r, gradient of
    # r = exp(mean(logp - old)) is r / n_tokens on each token -> d loss / d logp = -1 / 2 / 2 (two sequences).
    logp = (OLD + torch.tensor([[0.1, -0.1], [0.0, 0.0]], dtype=F64)).requires_grad_()
    loss, _ = clipped_pg_loss(logp, OLD, OLD.clone(), ADV, MASK, _seq_cfg())
    loss.backward()
    torch.testing.assert_close(logp.grad[0], torch.tensor([-0.25, -0.25], dtype=F64))


def test_sequence_level_importance_weight_is_exp_of_the_summed_log_ratio():
    # old - gen: row 0 = ln2, ln3 -> w = 6 for the sequence; row 1 = -ln2 -> w = 0.5. r = 1 (logp = old):
    # loss = mean_seq(w * token mean of -A r) = (6 * -1 + 0.5 * 1) / 2; sampling_importance_ratio = (6 + .5) / 2.
    gen = OLD - torch.tensor([[LN2, LN3], [-LN2, 0.0]], dtype=F64)
    gen[1, 1] = float("nan")  # padding: ignored
    logp = OLD.clone().requires_grad_()
    loss, m = clipped_pg_loss(logp, OLD, gen, ADV, MASK, _seq_cfg(use_importance_sampling_correction=True))
    assert loss.item() == pytest.approx((-6.0 + 0.5) / 2, rel=1e-12)
    assert m["sampling_importance_ratio"] == pytest.approx(3.25, rel=1e-12)
    tis = _seq_cfg(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
    )
    loss, m = clipped_pg_loss(logp, OLD, gen, ADV, MASK, tis)  # w 6 -> 2 (both tokens of row 0 out of bounds)
    assert loss.item() == pytest.approx((-2.0 + 0.5) / 2, rel=1e-12)
    assert m["is_oob_ratio"] == pytest.approx(2 / 3, rel=1e-12)


def test_sequence_level_ratios_refuse_token_level_loss_and_seq_mask_tis():
    with pytest.raises(ValueError, match="token_level_loss"):
        LossConfig(sequence_level_importance_ratios=True)
    with pytest.raises(ValueError, match="seq-mask-tis"):
        _seq_cfg(
            use_importance_sampling_correction=True,
            truncated_importance_sampling_type="seq-mask-tis",
            truncated_importance_sampling_ratio=2.0,
            truncated_importance_sampling_ratio_min=0.5,
        )


# One token, A = 0 (KL term alone), beta = 1, logp = ref - x: value v k(x) and gradient d(v k)/d logp with
# v = exp(logp - sg(logp)) = 1 (d v / d logp = 1): k1 = -x (d/dlogp = 1), k2 = x^2/2 (-x), k3 = e^x - x - 1 (1 - e^x).
X = 0.5
KL_CASES = {
    "k1": (-X, 1.0 + -X),
    "k2": (X * X / 2, -X + X * X / 2),
    "k3": (math.exp(X) - X - 1, (1 - math.exp(X)) + (math.exp(X) - X - 1)),
}


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_kl_types_values_and_gradients(kl_type):
    value, grad = KL_CASES[kl_type]
    ref = torch.tensor([[-1.0]], dtype=F64)
    logp = (ref - X).requires_grad_()
    cfg = LossConfig(reference_policy_kl_penalty=1.0, reference_policy_kl_type=kl_type)
    zeros = torch.zeros(1, dtype=F64)
    loss, m = clipped_pg_loss(logp, logp.detach(), logp.detach(), zeros, torch.ones(1, 1), cfg, logp_ref=ref)
    loss.backward()
    assert m["kl_penalty"] == pytest.approx(value, rel=1e-12)
    assert loss.item() == pytest.approx(value, rel=1e-12)
    assert logp.grad.item() == pytest.approx(grad, rel=1e-12)


def test_on_policy_kl_approximation_weighs_by_the_rollout_ratio():
    # v = exp(logp - logp_gen) = 2 (value and d v / d logp = 2): k3 value 2 k3(x), gradient 2 (1 - e^x) + 2 k3(x).
    ref = torch.tensor([[-1.0]], dtype=F64)
    logp = (ref - X).requires_grad_()
    gen = logp.detach() - LN2
    k3 = math.exp(X) - X - 1
    cfg = LossConfig(reference_policy_kl_penalty=1.0, use_on_policy_kl_approximation=True)
    loss, _ = clipped_pg_loss(logp, logp.detach(), gen, torch.zeros(1, dtype=F64), torch.ones(1, 1), cfg, logp_ref=ref)
    loss.backward()
    assert loss.item() == pytest.approx(2 * k3, rel=1e-12)
    assert logp.grad.item() == pytest.approx(2 * (1 - math.exp(X)) + 2 * k3, rel=1e-12)


def test_kl_input_clamp_cuts_the_weight_gradient_too():
    # x = 30 > clamp 20: k1 = -20 (constant), weight detached there -> no gradient at all (NeMo-RL's calculate_kl).
    ref = torch.tensor([[0.0]], dtype=F64)
    logp = (ref - 30.0).requires_grad_()
    cfg = LossConfig(
        reference_policy_kl_penalty=1.0, reference_policy_kl_type="k1", kl_output_clamp_value=None
    )
    loss, _ = clipped_pg_loss(logp, logp.detach(), logp.detach(), torch.zeros(1), torch.ones(1, 1), cfg, logp_ref=ref)
    loss.backward()
    assert loss.item() == pytest.approx(-20.0) and logp.grad.item() == 0.0
