"""Mismatch metrics: exact values on a hand-built 2x3 example (d = logp_train - logp_gen)."""

import math

import pytest
import torch

from nemo_jetrl.algorithms.mismatch import kl_estimator, mismatch_metrics

LN2, LN15 = math.log(2.0), math.log(1.5)
# 4 generated tokens with d = [0, ln2, -ln2, ln1.5] (row 1 has one response token, then padding)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])
TRAIN = torch.tensor([[-1.0, -0.5, -2.0], [-0.7, -3.0, -3.0]], dtype=torch.float64)
D = torch.tensor([[0.0, LN2, -LN2], [LN15, 0.0, 0.0]], dtype=torch.float64)


def _gen(pad_value=float("nan")):
    gen = TRAIN - D
    gen[1, 1:] = pad_value  # padding: ignored and not counted
    return gen


def _expected():
    # token_mult_prob_error = mean(exp|d|) = (1 + 2 + 2 + 1.5) / 4 = 1.625
    # gen_kl (k3, logr = d):  exp(d) - d - 1 = 0, 1 - ln2, ln2 - 1/2, 1/2 - ln1.5   -> sum = 1 - ln1.5
    # policy_kl (k3, logr = -d): exp(-d) + d - 1 = 0, ln2 - 1/2, 1 - ln2, 2/3 + ln1.5 - 1 -> sum = 1/6 + ln1.5
    # JS per token with rho = p/q: 0.5[(p/m - 1 - ln p/m) + (q/m - 1 - ln q/m)] = ln((rho + 1) / (2 sqrt(rho)))
    #   rho = 1 -> 0; rho = 2 or 1/2 -> ln(3 / (2 sqrt 2)); rho = 1.5 -> ln(2.5 / (2 sqrt 1.5))
    js = 2 * math.log(3 / (2 * math.sqrt(2))) + math.log(2.5 / (2 * math.sqrt(1.5)))
    return {
        "token_mult_prob_error": 1.625,
        "gen_kl_error": (1 - LN15) / 4,
        "policy_kl_error": (1 / 6 + LN15) / 4,
        "js_divergence_error": js / 4,
        "exact_token_fraction": 1 / 4,  # d = 0 on one of the four tokens
        "num_valid_tokens": 4.0,
        "num_nonfinite_tokens": 0.0,
    }


def test_exact_values():
    got = mismatch_metrics(TRAIN, _gen(), MASK)
    exp = _expected()
    assert got.keys() == exp.keys()
    for k, v in exp.items():
        assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k


def test_k1_estimators():
    # k1: gen_kl = mean(-logr) with logr = d -> -(0 + ln2 - ln2 + ln1.5) / 4; policy_kl = +ln1.5 / 4
    got = mismatch_metrics(TRAIN, _gen(), MASK, kl_type="k1")
    assert got["gen_kl_error"] == pytest.approx(-LN15 / 4, rel=1e-12)
    assert got["policy_kl_error"] == pytest.approx(LN15 / 4, rel=1e-12)


def test_identical_logprobs_give_no_mismatch():
    got = mismatch_metrics(TRAIN, TRAIN.clone(), MASK)
    assert got["token_mult_prob_error"] == 1.0
    assert got["gen_kl_error"] == got["policy_kl_error"] == got["js_divergence_error"] == 0.0


def test_nonfinite_generated_logprobs_are_counted_not_propagated():
    # Extend the mask over two more tokens whose gen logprob is NaN / -inf: they are counted and left out,
    # so every mean equals the clean 4-token example.
    mask = torch.tensor([[1, 1, 1], [1, 1, 1]])
    gen = _gen()
    gen[1, 1], gen[1, 2] = float("nan"), float("-inf")
    got = mismatch_metrics(TRAIN, gen, mask)
    exp = _expected() | {"num_nonfinite_tokens": 2.0}
    for k, v in exp.items():
        assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
    assert all(math.isfinite(v) for v in got.values())


def test_empty_mask_gives_neutral_values():
    got = mismatch_metrics(TRAIN, _gen(), torch.zeros(2, 3))
    assert got["token_mult_prob_error"] == 1.0 and got["gen_kl_error"] == 0.0 and got["num_valid_tokens"] == 0.0


def test_kl_estimator_forms_and_clamps():
    lp, ref = torch.zeros(3), torch.tensor([LN2, -LN2, 25.0])
    # k3 = exp(logr) - logr - 1 with logr = ref - lp: 1 - ln2, ln2 - 1/2, e^25 - 26
    k3 = kl_estimator(lp.double(), ref.double())
    torch.testing.assert_close(k3, torch.tensor([1 - LN2, LN2 - 0.5, math.exp(25) - 26], dtype=torch.float64))
    # input clamp 20 -> e^20 - 21 = 4.85e8, output clamp 10 -> 10
    assert kl_estimator(lp, ref, input_clamp_value=20.0, output_clamp_value=10.0)[2].item() == 10.0
    torch.testing.assert_close(kl_estimator(lp, ref, "k1"), -ref)
    torch.testing.assert_close(kl_estimator(lp, ref, "k2"), ref.square() / 2)
    with pytest.raises(ValueError, match="kl_type"):
        kl_estimator(lp, ref, "k4")


def test_shape_errors():
    with pytest.raises(ValueError, match="shape mismatch"):
        mismatch_metrics(TRAIN, TRAIN[:, :2], MASK)
    with pytest.raises(ValueError, match="logp_train"):
        mismatch_metrics(TRAIN[0], TRAIN, MASK)


def test_mismatch_by_position_bins_response_positions():
    from nemo_jetrl.algorithms.mismatch import mismatch_by_position

    # row 0: response in columns 1..4 (positions 0..3); row 1: columns 3..4 (positions 0..1)
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 0, 1, 1]], dtype=torch.float32)
    d = torch.tensor([[9.0, 0.1, 0.2, 0.3, 0.4], [9.0, 9.0, 9.0, -0.5, 0.6]], dtype=torch.float64)
    gen = torch.zeros(2, 5, dtype=torch.float64)
    out = mismatch_by_position(d, gen, mask, 2)
    e = torch.exp(torch.tensor([0.1, 0.2, 0.5, 0.6, 0.3, 0.4], dtype=torch.float64)).tolist()
    assert out.keys() == {"00000", "00002"}
    assert out["00000"] == pytest.approx((e[0] + e[1] + e[2] + e[3]) / 4, rel=1e-12)  # positions 0, 1 of both rows
    assert out["00002"] == pytest.approx((e[4] + e[5]) / 2, rel=1e-12)
    # one bin holding everything equals the overall token_mult_prob_error
    assert mismatch_by_position(d, gen, mask, 64)["00000"] == pytest.approx(
        mismatch_metrics(d, gen, mask)["token_mult_prob_error"], rel=1e-6
    )


def test_mismatch_by_position_at_16k_tokens_keeps_one_name_per_bin():
    """16,384-token responses in 1,024-token bins: 16 bins named by their 5-digit start; a step whose longest
    response ends before position 10,000 names its bins the same way (one metric series per bin)."""
    from nemo_jetrl.algorithms.mismatch import mismatch_by_position

    long_mask = torch.zeros(2, 16_500)
    long_mask[:, 100:16_484] = 1  # 16,384 response tokens per row
    d = torch.zeros(2, 16_500, dtype=torch.float64)
    d[0, 100 + 15_360 :] = 0.5  # the last bin of row 0 drifts
    out = mismatch_by_position(d, torch.zeros_like(d), long_mask, 1024)
    assert list(out) == [f"{b * 1024:05d}" for b in range(16)] and out["15360"] == pytest.approx((math.exp(0.5) + 1) / 2)
    assert all(out[k] == 1.0 for k in list(out)[:-1])
    short = mismatch_by_position(d[:, :9_400], torch.zeros(2, 9_400, dtype=torch.float64), long_mask[:, :9_400], 1024)
    assert list(short) == list(out)[:10] and "09216" in short


def test_mismatch_by_position_skips_nonfinite_and_empty():
    from nemo_jetrl.algorithms.mismatch import mismatch_by_position

    mask = torch.ones(1, 4)
    train = torch.tensor([[0.0, float("nan"), 0.0, 0.0]])
    out = mismatch_by_position(train, torch.zeros(1, 4), mask, 1)
    assert out == {"00000": 1.0, "00002": 1.0, "00003": 1.0}  # position 1 has no usable token
    assert mismatch_by_position(train, torch.zeros(1, 4), torch.zeros(1, 4), 1) == {}
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="bin_tokens"):
            mismatch_by_position(train, torch.zeros(1, 4), mask, bad)
