"""Sampler: greedy equivalences, exact logprobs, temperature frequencies, filters, seeding."""

import math

import pytest
import torch

from nemo_jetrl.generation.native.sampler import SamplingParams, filter_logits, sample


def random_logits(rows: int = 64, vocab: int = 32) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3


def test_top_k_one_equals_greedy():
    logits = random_logits()
    greedy, greedy_lp = sample(logits, SamplingParams(temperature=0.8), greedy=True)
    tokens, lp = sample(logits, SamplingParams(temperature=0.8, top_k=1), generator=torch.Generator().manual_seed(5))
    assert torch.equal(tokens, greedy)
    assert torch.equal(lp, greedy_lp)
    assert torch.equal(greedy, logits.argmax(-1))


def test_tiny_top_p_equals_greedy():
    logits = random_logits()
    greedy, _ = sample(logits, SamplingParams(), greedy=True)
    tokens, _ = sample(logits, SamplingParams(top_p=1e-6), generator=torch.Generator().manual_seed(6))
    assert torch.equal(tokens, greedy)


def test_logprob_is_unfiltered_log_softmax_of_scaled_logits():
    # probabilities 1/8, 2/8, 5/8 at temperature 1; top_k=1 must not renormalise the reported logprob to 0
    logits = torch.log(torch.tensor([[1.0, 2.0, 5.0]]))
    tokens, lp = sample(logits, SamplingParams(top_k=1), generator=torch.Generator().manual_seed(0))
    assert tokens.tolist() == [2]
    assert lp.item() == pytest.approx(math.log(5 / 8), abs=1e-6)
    # temperature 0.5 squares the odds: 1, 4, 25 -> logprob of token 2 = log(25/30)
    _, lp_t = sample(logits, SamplingParams(temperature=0.5), greedy=True)
    assert lp_t.item() == pytest.approx(math.log(25 / 30), abs=1e-6)
    assert lp_t.dtype == torch.float32


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_temperature_sampling_frequencies_match_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -2.0])
    temperature, draws = 0.7, 40_000
    tokens, _ = sample(
        logits.expand(draws, -1), SamplingParams(temperature=temperature), generator=torch.Generator().manual_seed(7)
    )
    counts = torch.bincount(tokens, minlength=5).double()
    probs = torch.softmax(logits.double() / temperature, -1)
    # 4 degrees of freedom: P(chi2 > 18.47) = 0.001
    assert chi_square(counts, probs) < 18.47
    # the same counts are far from the temperature-1 distribution: the test can tell temperatures apart
    assert chi_square(counts, torch.softmax(logits.double(), -1)) > 500


def test_top_k_and_top_p_restrict_support():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    draws = 4000
    gen = torch.Generator().manual_seed(8)
    top_k, _ = sample(logits.expand(draws, -1), SamplingParams(top_k=2), generator=gen)
    assert set(top_k.unique().tolist()) == {0, 1}
    probs = torch.softmax(logits, -1)  # 0.644, 0.237, 0.087, 0.032
    # nucleus = smallest top set whose mass reaches top_p: {0, 1} (0.881) for 0.85, {0, 1, 2} (0.968) for 0.9
    assert 0.85 < float(probs[:2].sum()) < 0.9 < float(probs[:3].sum())
    top_p, _ = sample(logits.expand(draws, -1), SamplingParams(top_p=0.85), generator=gen)
    assert set(top_p.unique().tolist()) == {0, 1}
    top_p, _ = sample(logits.expand(draws, -1), SamplingParams(top_p=0.9), generator=gen)
    assert set(top_p.unique().tolist()) == {0, 1, 2}


def test_filter_logits_exact_masks():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    kept_p = torch.isfinite(filter_logits(logits, None, 0.6))
    assert kept_p.tolist() == [[True, True, False], [False, True, True]]
    kept_k = torch.isfinite(filter_logits(logits, 1, 1.0))
    assert kept_k.tolist() == [[True, False, False], [False, False, True]]
    assert torch.equal(filter_logits(logits, None, 1.0), logits)


def test_seeded_reproducibility():
    logits = random_logits()
    params = SamplingParams(temperature=1.3, top_p=0.9, top_k=20)
    a, lp_a = sample(logits, params, generator=torch.Generator().manual_seed(11))
    b, lp_b = sample(logits, params, generator=torch.Generator().manual_seed(11))
    c, _ = sample(logits, params, generator=torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and torch.equal(lp_a, lp_b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
    ],
)
def test_invalid_params_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_logits_must_be_2d():
    with pytest.raises(ValueError, match="logits"):
        sample(torch.zeros(2, 3, 4), SamplingParams())


def _splitmix64(x: int) -> int:
    """The published splitmix64 finaliser on Python ints (mod 2**64): the independent reference for mix64."""
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_mix64_is_splitmix64_with_wraparound():
    from nemo_jetrl.generation.native.sampler import mix64

    xs = [0, 1, 2, 12345, 2**40 + 7, 2**63 - 1, -1, -(2**63)]
    got = mix64(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert [g & ((1 << 64) - 1) for g in got] == [_splitmix64(x & ((1 << 64) - 1)) for x in xs]


def test_uniforms_are_uniform_and_a_rows_draw_depends_on_its_key_and_counter_only():
    from nemo_jetrl.generation.native.sampler import sequence_keys, uniforms

    keys = sequence_keys(7, torch.arange(20_000))
    u = uniforms(keys, 3)
    counts = torch.histc(u, bins=10, min=0.0, max=1.0).double()
    assert chi_square(counts, torch.full((10,), 0.1, dtype=torch.float64)) < 27.88  # 9 dof, P = 0.001
    assert uniforms(keys, 4).sub(u).abs().min() > 0  # the next draw is another number
    # row 5's draw alone, in another batch order, at its own counter: the same number
    perm = torch.randperm(20_000, generator=torch.Generator().manual_seed(0))
    assert uniforms(keys[perm], 3)[(perm == 5).nonzero()[0, 0]] == u[5]
    assert uniforms(keys[5:6], torch.tensor([3])) == u[5]
    assert not torch.equal(uniforms(sequence_keys(8, torch.arange(20_000)), 3), u)  # another seed, other draws


FUSED_CHILD = """
import json, torch
from nemo_jetrl.generation.native.sample_kernel import sample_fused
from nemo_jetrl.generation.native.sampler import SamplingParams, sample, sequence_keys, uniforms
from nemo_jetrl.models.logprobs import token_logprobs
g = torch.Generator().manual_seed(0)
out = {}
for name, vocab, temperature, dtype in (("bf16_t1", 9000, 1.0, torch.bfloat16), ("f32_t07", 5000, 0.7, torch.float32)):
    logits = (torch.randn(48, vocab, generator=g) * 4).to(dtype)  # [B, V], V spans several kernel steps
    logits[:, 100:200] = float("-inf")  # zero-probability tokens are never drawn
    keys = sequence_keys(123, torch.arange(48))
    tokens, logp = sample_fused(logits, uniforms(keys, 5), temperature)
    twin, _ = sample(logits, SamplingParams(temperature=temperature), keys=keys, counters=5)  # CPU: the twin
    ref_logp = token_logprobs(logits, tokens, temperature, fused=True)  # the fused logprob kernel, same bits
    out[name] = [torch.equal(tokens, twin), torch.equal(logp, ref_logp), bool(((tokens >= 100) & (tokens < 200)).any())]
# a row whose mass sits on one token: drawn whatever u is (u near 1 included)
peaked = torch.full((4, 9000), -1e4)
peaked[:, 8000] = 0.0
tokens, _ = sample_fused(peaked, torch.tensor([0.0, 0.5, 0.999999, 1 - 2**-53], dtype=torch.float64), 1.0)
out["peaked"] = tokens.tolist()
# u = 1 (past every running sum, as rounding can leave it): the last token of non-zero weight, never a -inf one
tail = torch.randn(2, 9000, generator=g)
tail[:, 5000:] = float("-inf")
out["at_end"] = sample_fused(tail, torch.ones(2, dtype=torch.float64), 1.0)[0].tolist()
# the exact mode's draw: the fused kernel's token, its logprob the exact mode's log-sum-exp (not the kernel's)
from nemo_jetrl.models import batch_invariant
logits = (torch.randn(40, 9000, generator=g) * 4).to(torch.bfloat16)
keys = sequence_keys(9, torch.arange(40))
tokens, logp = sample(logits, SamplingParams(temperature=0.7), keys=keys, counters=2, batch_invariant=True, fused=True)
fused_tokens, fused_logp = sample_fused(logits, uniforms(keys, 2), 0.7)
exact_logp = batch_invariant.token_logprobs(logits, tokens, 0.7)
sub = sample(logits[7:19], SamplingParams(temperature=0.7), keys=keys[7:19], counters=2, batch_invariant=True, fused=True)
out["exact"] = [torch.equal(tokens, fused_tokens), torch.equal(logp, exact_logp), torch.equal(logp, fused_logp),
                torch.equal(sub[0], tokens[7:19]) and torch.equal(sub[1], logp[7:19])]
print(json.dumps(out))
"""


def test_fused_sampler_draws_the_twins_tokens_and_the_fused_logprobs(run_interpreted):
    out = run_interpreted(FUSED_CHILD)
    assert out["bf16_t1"] == [True, True, False] and out["f32_t07"] == [True, True, False]
    assert out["peaked"] == [8000] * 4
    assert out["at_end"] == [4999, 4999]
    # exact mode: the kernel's token; the exact logprob, which here differs from the kernel's (x / T against
    # x * (1 / T) in float32); a row's draw the same in a smaller batch
    assert out["exact"] == [True, True, False, True]
