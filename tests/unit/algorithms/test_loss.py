"""Clipped PG loss: hand-computed loss values and gradients on a 2x3 batch for every IS truncation type."""

import math
from pathlib import Path

import pytest
import torch
import yaml

from nemo_jetrl.algorithms.config import LossConfig
from nemo_jetrl.algorithms.loss import clipped_pg_loss, importance_weights

F64 = torch.float64
# Row 0: 3 response tokens, advantage +1. Row 1: 2 response tokens + 1 padding, advantage -2.
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0], dtype=F64)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-1.5, -0.3, 0.0]], dtype=F64)
RATIO = torch.tensor([[1.1, 1.5, 0.7], [0.9, 0.5, 1.0]], dtype=F64)  # r = exp(logp - logp_old)
W = torch.tensor([[1.0, 2.0, 0.5], [4.0, 0.9, 1.0]], dtype=F64)  # w = exp(logp_old - logp_gen)

# Clip range [0.8, 1.2]. pg = max(-A r, -A clip(r)); d pg / d logp = -A r on the unclipped branch, else 0.
#   row 0 (A=+1): r 1.1 -> -1.1 (grad -1.1); r 1.5 -> max(-1.5, -1.2) = -1.2 (clipped, 0); r 0.7 -> max(-.7, -.8) = -.7 (grad -.7)
#   row 1 (A=-2): r 0.9 -> 1.8 (grad 1.8); r 0.5 -> max(1.0, 1.6) = 1.6 (clipped, 0)
PG = torch.tensor([[-1.1, -1.2, -0.7], [1.8, 1.6, 0.0]], dtype=F64)
DPG = torch.tensor([[-1.1, 0.0, -0.7], [1.8, 0.0, 0.0]], dtype=F64)


def _inputs():
    logp = (OLD + RATIO.log()).requires_grad_()
    gen = OLD - W.log()
    gen[1, 2] = float("nan")  # padding
    return logp, OLD.clone(), gen


def _cfg(**kw):
    """The validated `loss_fn` section as the policies hand it to the loss."""
    return LossConfig(**kw)


IS = dict(use_importance_sampling_correction=True)
# (config, weights actually applied (hand-derived), token-level loss, is_oob_ratio, sampling_importance_ratio)
CASES = {
    # no correction: w = 1 -> (-1.1 - 1.2 - 0.7 + 1.8 + 1.6) / 5 = 0.4 / 5; metric reports raw mean w = 8.4 / 5
    "none": (_cfg(), [[1, 1, 1], [1, 1, 0]], 0.08, 0.0, 1.68),
    # raw w: (-1.1 - 2.4 - 0.35 + 7.2 + 1.44) / 5 = 4.79 / 5
    "is": (_cfg(**IS), [[1, 2, 0.5], [4, 0.9, 0]], 0.958, 0.0, 1.68),
    # tis max 3 (min 0): 4 -> 3, 1 of 5 oob: (-1.1 - 2.4 - 0.35 + 5.4 + 1.44) / 5 = 2.99 / 5; mean w 7.4 / 5
    "tis": (
        _cfg(**IS, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=3.0),
        [[1, 2, 0.5], [3, 0.9, 0]],
        0.598,
        0.2,
        1.48,
    ),
    # tis [0.6, 3]: 0.5 -> 0.6, 4 -> 3, 2 of 5 oob: (-1.1 - 2.4 - 0.42 + 5.4 + 1.44) / 5 = 2.92 / 5; mean w 7.5 / 5
    "tis_min": (
        _cfg(
            **IS,
            truncated_importance_sampling_type="tis",
            truncated_importance_sampling_ratio=3.0,
            truncated_importance_sampling_ratio_min=0.6,
        ),
        [[1, 2, 0.6], [3, 0.9, 0]],
        0.584,
        0.4,
        1.5,
    ),
    # icepop [0.6, 3]: 0.5 and 4 zeroed: (-1.1 - 2.4 + 1.44) / 5 = -2.06 / 5; mean w 3.9 / 5
    "icepop": (
        _cfg(
            **IS,
            truncated_importance_sampling_type="icepop",
            truncated_importance_sampling_ratio=3.0,
            truncated_importance_sampling_ratio_min=0.6,
        ),
        [[1, 2, 0], [0, 0.9, 0]],
        -0.412,
        0.4,
        0.78,
    ),
    # seq-mask-tis [0.5, 1.5]: geo-means row 0 = (1 * 2 * 0.5)^(1/3) = 1 (kept, RAW w 2 and 0.5 stay untruncated),
    #   row 1 = sqrt(4 * 0.9) = 1.897 (dropped): (-1.1 - 2.4 - 0.35) / 5 = -3.85 / 5; 1 of 2 sequences oob; mean w 3.5 / 5
    "seq_mask_tis": (
        _cfg(
            **IS,
            truncated_importance_sampling_type="seq-mask-tis",
            truncated_importance_sampling_ratio=1.5,
            truncated_importance_sampling_ratio_min=0.5,
        ),
        [[1, 2, 0.5], [0, 0, 0]],
        -0.77,
        0.5,
        0.7,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_token_level_loss_and_grad(name):
    cfg, w, loss_expected, oob_ratio, sir = CASES[name]
    w = torch.tensor(w, dtype=F64)
    logp, old, gen = _inputs()
    loss, metrics = clipped_pg_loss(logp, old, gen, ADV, MASK, cfg)
    loss.backward()
    assert loss.item() == pytest.approx(loss_expected, rel=1e-12)
    assert loss.item() == pytest.approx(float((w * PG).sum() / 5), rel=1e-12)
    torch.testing.assert_close(logp.grad, w * DPG / 5, rtol=1e-12, atol=1e-15)  # d loss / d logp = w dpg / 5
    assert metrics["is_oob_ratio"] == pytest.approx(oob_ratio, abs=1e-15)
    assert metrics["sampling_importance_ratio"] == pytest.approx(sir, rel=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_sequence_level_loss_and_grad(name):
    # per-sequence token mean, then / 2 sequences: row 0 has 3 tokens, row 1 has 2.
    cfg, w, _, _, _ = CASES[name]
    cfg = cfg.model_copy(update={"token_level_loss": False})
    w = torch.tensor(w, dtype=F64)
    logp, old, gen = _inputs()
    loss, _ = clipped_pg_loss(logp, old, gen, ADV, MASK, cfg)
    loss.backward()
    n_tok = torch.tensor([[3.0], [2.0]], dtype=F64)
    assert loss.item() == pytest.approx(float(((w * PG) / n_tok).sum() / 2), rel=1e-12)
    torch.testing.assert_close(logp.grad, w * DPG / n_tok / 2, rtol=1e-12, atol=1e-15)
    if name == "none":  # row means -3.0 / 3 = -1 and 3.4 / 2 = 1.7 -> 0.7 / 2
        assert loss.item() == pytest.approx(0.35, rel=1e-12)
    if name == "icepop":  # (-3.5 / 3 + 1.44 / 2) / 2
        assert loss.item() == pytest.approx((-3.5 / 3 + 0.72) / 2, rel=1e-12)


def test_metrics_values():
    logp, old, gen = _inputs()
    _, m = clipped_pg_loss(logp, old, gen, ADV, MASK, _cfg())
    assert m["probs_ratio"] == pytest.approx(4.7 / 5, rel=1e-12)  # (1.1 + 1.5 + .7 + .9 + .5) / 5
    assert m["probs_ratio_clamped"] == pytest.approx(4.8 / 5, rel=1e-12)  # (1.1 + 1.2 + .8 + .9 + .8) / 5
    assert m["probs_ratio_min"] == pytest.approx(0.5) and m["probs_ratio_max"] == pytest.approx(1.5)
    assert m["clip_fraction"] == pytest.approx(3 / 5)  # 1.5, 0.7, 0.5 lie outside [0.8, 1.2]
    # approx_entropy = -mean(exp(logp - logp_gen) logp), exp(logp - gen) = r * w
    rw = [1.1 * 1, 1.5 * 2, 0.7 * 0.5, 0.9 * 4, 0.5 * 0.9]
    lp = [-1 + math.log(1.1), -0.5 + math.log(1.5), -2 + math.log(0.7), -1.5 + math.log(0.9), -0.3 + math.log(0.5)]
    assert m["approx_entropy"] == pytest.approx(-sum(a * b for a, b in zip(rw, lp)) / 5, rel=1e-12)
    assert m["loss"] == pytest.approx(0.08) and m["kl_penalty"] == 0.0
    assert m["num_valid_tokens"] == 5.0 and m["num_valid_samples"] == 2.0


def test_dual_clip():
    # logp_old = 0, ratios [[4, 2], [4, 0.5]], A = [-2, +1], c = 3:
    #   A=-2, r=4: max(8, 2.4) = 8 -> min(8, 3*2=6) = 6 (grad 0); r=2: max(4, 2.4) = 4 < 6 -> 4 (grad 2*2 = 4)
    #   A=+1, r=4: max(-4, -1.2) = -1.2 (grad 0); r=.5: max(-.5, -.8) = -.5 (grad -.5)  (dual clip only for A < 0)
    ratio = torch.tensor([[4.0, 2.0], [4.0, 0.5]], dtype=F64)
    adv, mask, zeros = torch.tensor([-2.0, 1.0], dtype=F64), torch.ones(2, 2), torch.zeros(2, 2, dtype=F64)
    for c, loss_expected, grad in (
        (3.0, 8.3 / 4, [[0.0, 4.0], [0.0, -0.5]]),
        (None, 10.3 / 4, [[8.0, 4.0], [0.0, -0.5]]),
    ):
        logp = ratio.log().requires_grad_()
        loss, _ = clipped_pg_loss(logp, zeros, zeros, adv, mask, _cfg(ratio_clip_c=c))
        loss.backward()
        assert loss.item() == pytest.approx(
            loss_expected, rel=1e-12
        )  # (6 + 4 - 1.2 - .5) / 4 vs (8 + 4 - 1.2 - .5) / 4
        torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=F64) / 4, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("token_level", [True, False])
def test_kl_penalty(token_level):
    # A = 0 isolates the KL term. x = ref - logp = [[0, ln2, -ln2], [ln2, ln2, pad]]; k3 = e^x - x - 1:
    #   0, 1 - ln2, ln2 - 1/2, 1 - ln2, 1 - ln2; d k3 / d logp = 1 - e^x = 0, -1, 0.5, -1, -1
    # NeMo-RL weighs k3 by v = exp(logp - sg(logp)) (value 1): d(v k3)/d logp = d k3 / d logp + k3.
    ln2 = math.log(2.0)
    x = torch.tensor([[0.0, ln2, -ln2], [ln2, ln2, 0.0]], dtype=F64)
    logp, old, gen = _inputs()
    ref = logp.detach() + x
    cfg = _cfg(reference_policy_kl_penalty=0.1, token_level_loss=token_level)
    loss, m = clipped_pg_loss(logp, old, gen, torch.zeros(2, dtype=F64), MASK, cfg, logp_ref=ref)
    loss.backward()
    k3 = torch.tensor([[0.0, 1 - ln2, ln2 - 0.5], [1 - ln2, 1 - ln2, 0.0]], dtype=F64)
    dk3 = torch.tensor([[0.0, -1.0, 0.5], [-1.0, -1.0, 0.0]], dtype=F64) + k3
    if token_level:
        kl = (0.5 + 2 * (1 - ln2)) / 5  # row 0 sums to 1 - ln2 + ln2 - 1/2 = 0.5
        grad = 0.1 * dk3 / 5
    else:
        kl = (0.5 / 3 + (1 - ln2)) / 2
        grad = 0.1 * dk3 / torch.tensor([[3.0], [2.0]], dtype=F64) / 2
    assert loss.item() == pytest.approx(0.1 * kl, rel=1e-12)
    assert m["kl_penalty"] == pytest.approx(kl, rel=1e-12)
    torch.testing.assert_close(logp.grad, grad, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="logp_ref"):
        clipped_pg_loss(logp, old, gen, ADV, MASK, cfg)


def test_seq_mask_tis_keeps_sequences_by_their_geometric_mean_ratio():
    """Each row separates the geometric mean over the row's own tokens from a plausible wrong statistic (the
    product, the arithmetic mean, the log-mean over the padded width): bounds [0.5, 1.5]."""
    w = torch.tensor(
        [
            [1.3, 1.3, 1.3],  # geo 1.3 kept; product 2.197 would drop it
            [0.7, 0.7, 0.7],  # geo 0.7 kept; product 0.343 would drop it
            [1.6, 1.6, 9.0],  # 2 tokens: geo 1.6 dropped; exp(sum / 3 columns) = 1.37 would keep it
            [4.0, 0.3, 1.0],  # geo 1.2^(1/3) = 1.063 kept; arithmetic mean 1.77 would drop it
            [0.2, 2.0, 2.0],  # geo 0.8^(1/3) = 0.928 kept; the max (2) / min (0.2) would drop it
        ],
        dtype=F64,
    )
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    old = -torch.rand(5, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    gen = old - w.log()
    cfg = CASES["seq_mask_tis"][0]
    weights, oob = importance_weights(old, gen, mask, cfg)
    kept = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0], dtype=F64)
    torch.testing.assert_close(weights, w * mask * kept[:, None], rtol=1e-12, atol=0)  # kept rows: raw w
    assert oob.tolist() == [[False] * 3, [False] * 3, [True, True, False], [False] * 3, [False] * 3]
    logp = old.clone().requires_grad_()  # r = 1: pg = -A on every token
    adv = torch.tensor([1.0, -1.0, 2.0, 0.5, -0.5], dtype=F64)
    loss, metrics = clipped_pg_loss(logp, old, gen, adv, mask, cfg)
    expected = -(adv[:, None] * w * mask * kept[:, None]).sum() / mask.sum()
    assert loss.item() == pytest.approx(float(expected), rel=1e-12)
    assert metrics["is_oob_ratio"] == pytest.approx(1 / 5, rel=1e-6)  # one of five sequences (a float32 ratio)


@pytest.mark.parametrize("name", ["none", "tis_min", "icepop", "seq_mask_tis"])
def test_padding_values_change_nothing(name):
    cfg = CASES[name][0].model_copy(update={"reference_policy_kl_penalty": 0.05})
    adv = ADV.unsqueeze(-1).expand(2, 3).clone()  # [B, S] advantages too

    def run(pad):
        logp, old, gen = _inputs()
        ref = OLD + 0.1
        with torch.no_grad():
            for t, v in ((logp, pad), (old, -pad), (gen, float("nan")), (ref, float("inf"))):
                t[1, 2] = v
        a = adv.clone()
        a[1, 2] = 1e9
        loss, metrics = clipped_pg_loss(logp, old, gen, a, MASK, cfg, logp_ref=ref)
        loss.backward()
        return loss.detach(), logp.grad, metrics

    base, changed = run(0.0), run(1e4)  # exp(2e4) would be inf if padding leaked
    assert torch.equal(base[0], changed[0]) and torch.isfinite(base[0])
    assert torch.equal(base[1], changed[1]) and base[1][1, 2] == 0.0
    assert base[2] == changed[2]


def test_advantages_per_token_equal_per_sequence():
    logp, old, gen = _inputs()
    l1, _ = clipped_pg_loss(logp, old, gen, ADV, MASK, CASES["icepop"][0])
    l2, _ = clipped_pg_loss(logp, old, gen, ADV.unsqueeze(-1).expand(2, 3), MASK, CASES["icepop"][0])
    assert torch.equal(l1, l2)


def test_nonfinite_gen_logprobs_get_zero_weight():
    # w = exp(old - gen): gen NaN -> NaN -> 0; gen -inf -> +inf -> 0; gen +inf -> 0
    gen = torch.tensor([[float("nan"), float("-inf"), float("inf")], [0.0, 0.0, 0.0]], dtype=F64)
    w, oob = importance_weights(OLD, gen, MASK, _cfg(**IS))
    torch.testing.assert_close(w, torch.tensor([[0, 0, 0], [math.exp(-1.5), math.exp(-0.3), 0]], dtype=F64))
    assert not oob.any() and not w.requires_grad
    # icepop: a zero weight lies below ratio_min -> out of bounds
    w, oob = importance_weights(OLD, gen, MASK, CASES["icepop"][0])
    # row 1: exp(-1.5) = .22 < .6 -> dropped, exp(-.3) = .74 in [.6, 3] -> kept; padding is never oob
    assert oob.tolist() == [[True, True, True], [True, False, False]]
    torch.testing.assert_close(w, torch.tensor([[0, 0, 0], [0, math.exp(-0.3), 0]], dtype=F64))
    # without correction w = 1 on response tokens
    w, oob = importance_weights(OLD, gen, MASK, _cfg())
    assert torch.equal(w, MASK.to(F64)) and not oob.any()
    # the loss stays finite with such tokens
    logp = OLD.clone().requires_grad_()
    loss, m = clipped_pg_loss(logp, OLD, gen, ADV, MASK, CASES["seq_mask_tis"][0])
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v) for k, v in m.items() if not k.startswith("probs_ratio_m"))


@pytest.mark.parametrize("token_level", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_micro_batches_with_global_normalizer_sum_to_full_batch(name, token_level):
    g = torch.Generator().manual_seed(0)
    b, s = 6, 7
    mask = (torch.rand(b, s, generator=g) > 0.3).long()
    mask[2] = 0  # a sequence with no tokens
    old = -torch.rand(b, s, generator=g, dtype=F64) * 2
    logp = (old + 0.3 * torch.randn(b, s, generator=g, dtype=F64)).requires_grad_()
    gen = old + 0.2 * torch.randn(b, s, generator=g, dtype=F64)
    ref = old + 0.1 * torch.randn(b, s, generator=g, dtype=F64)
    adv = torch.randn(b, generator=g, dtype=F64)
    cfg = CASES[name][0].model_copy(update={"token_level_loss": token_level, "reference_policy_kl_penalty": 0.1})
    full, _ = clipped_pg_loss(logp, old, gen, adv, mask, cfg, logp_ref=ref)
    (full_grad,) = torch.autograd.grad(full, logp)
    normalizer = float(mask.sum()) if token_level else float((mask.sum(-1) > 0).sum())
    total, grads = 0.0, []
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part = logp.detach()[sl].clone().requires_grad_()
        loss, _ = clipped_pg_loss(
            part, old[sl], gen[sl], adv[sl], mask[sl], cfg, logp_ref=ref[sl], normalizer=normalizer
        )
        loss.backward()
        total += loss.item()
        grads.append(part.grad)
    assert total == pytest.approx(full.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(torch.cat(grads), full_grad, rtol=1e-12, atol=1e-15)


def test_float32_trainer_inputs():
    # The trainer passes float32 logprobs and float32 [B] advantages; the result is float32 and matches float64.
    logp, old, gen = _inputs()
    l64, _ = clipped_pg_loss(logp, old, gen, ADV, MASK, CASES["tis"][0])
    l32, _ = clipped_pg_loss(
        logp.detach().float().requires_grad_(), old.float(), gen.float(), ADV.float(), MASK, CASES["tis"][0]
    )
    assert l32.dtype == torch.float32 and l32.item() == pytest.approx(l64.item(), rel=1e-6)


# --------------------------------------------------------------------------- config
def test_master_yaml_section_gives_the_documented_loss():
    path = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_base.yaml"
    cfg = LossConfig.model_validate(yaml.safe_load(path.read_text())["loss_fn"])
    assert (cfg.ratio_clip_min, cfg.ratio_clip_max, cfg.token_level_loss) == (0.2, 0.2, True)
    assert cfg.truncated_importance_sampling_type is None and cfg.use_importance_sampling_correction is False
    tis = _cfg(**IS, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=3)  # YAML int
    assert tis.truncated_importance_sampling_ratio_min == 0.0  # filled by the section, read as is by the loss
    logp, old, gen = _inputs()
    loss, _ = clipped_pg_loss(logp, old, gen, ADV, MASK, tis)
    assert loss.item() == pytest.approx(CASES["tis"][2], rel=1e-12)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(bogus_key=1), "bogus_key"),
        (
            dict(truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0),
            "use_importance_sampling_correction",
        ),
        (dict(**IS, truncated_importance_sampling_type="tis"), "ratio"),
        (
            dict(
                **IS,
                truncated_importance_sampling_type="icepop",
                truncated_importance_sampling_ratio=2.0,
                truncated_importance_sampling_ratio_min=3.0,
            ),
            "ratio_min",
        ),
        (dict(**IS, truncated_importance_sampling_type="clip", truncated_importance_sampling_ratio=2.0), "type"),
        (dict(**IS, truncated_importance_sampling_ratio=2.0), "_type is null"),
        (dict(ratio_clip_c=1.0), "ratio_clip_c"),
        (dict(ratio_clip_min=-0.1), "ratio_clip_min"),
        (dict(reference_policy_kl_type="k9"), "reference_policy_kl_type"),
    ],
)
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        LossConfig(**kw)


def test_bad_tensor_input():
    logp, old, gen = _inputs()
    with pytest.raises(ValueError, match="advantages"):
        clipped_pg_loss(logp, old, gen, torch.zeros(3), MASK, _cfg())
    with pytest.raises(ValueError, match="logp_gen"):
        clipped_pg_loss(logp, old, gen[:, :2], ADV, MASK, _cfg())
    with pytest.raises(ValueError, match="normalizer"):
        clipped_pg_loss(logp, old, gen, ADV, MASK, _cfg(), normalizer=0)


def test_metrics_without_a_host_sync_equal_the_synced_ones():
    logp, old, gen = _inputs()
    mask = MASK.clone()
    mask[1] = 0  # a row without tokens
    _, synced = clipped_pg_loss(logp, old, gen, ADV, mask, _cfg(**IS))
    _, lazy = clipped_pg_loss(logp, old, gen, ADV, mask, _cfg(**IS), sync_metrics=False)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in lazy.values())
    assert synced == {k: float(v) for k, v in lazy.items()}
    _, empty = clipped_pg_loss(logp, old, gen, ADV, torch.zeros_like(mask), _cfg(**IS))
    assert empty["probs_ratio_min"] == math.inf and empty["probs_ratio_max"] == -math.inf
    assert empty["num_valid_tokens"] == 0.0 and empty["loss"] == 0.0
