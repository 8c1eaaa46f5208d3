"""Sequence packing (`policy.sequence_packing`): the bin-packing algorithms, the packed micro-batches, and the
trainer's packed passes against its padded ones on the tiny model (FP32, and FP8 with exact emulation on CPU)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from jetrl_testkit.reference_step import make_batch

from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.policy.micro_batches import packed_micro_batches, plan_micro_batches
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.policy.sequence_packing import ALGORITHMS, fixed_packed_window, pack_lengths
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"


def _check_bins(bins: list[list[int]], lengths: list[int], capacity: int) -> None:
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))  # every sequence exactly once
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)


def test_first_fit_decreasing_fills_the_first_bin_that_fits():
    lengths = [4, 8, 1, 4, 2, 1]  # decreasing: 8, 4, 4, 2, 1, 1 into bins of 10
    bins = pack_lengths(lengths, 10, "first_fit_decreasing")
    assert bins == [[1, 4], [0, 3, 2, 5]]  # 8+2 | 4+4+1+1


def test_concatenative_keeps_the_batch_order():
    assert pack_lengths([4, 1, 3, 2, 1, 3, 4, 5], 5, "concatenative") == [[0, 1], [2, 3], [4, 5], [6], [7]]


def test_modified_first_fit_decreasing_pairs_smalls_where_first_fit_decreasing_needs_a_bin_more():
    # capacity 100: large 60 (row 0), 55 (row 2); small (100/6, 100/3]: 20 (rows 1, 4), 25 (row 3), 18 (row 5)
    lengths = [60, 20, 55, 25, 20, 18]
    assert pack_lengths(lengths, 100, "first_fit_decreasing") == [[0, 3], [2, 1, 4], [5]]  # 85 | 95 | 18
    # MFFD, backwards over the large bins: 55 takes the smallest small (18) and the largest that fits beside it
    # (25); 60 takes the two 20s: two full bins
    assert pack_lengths(lengths, 100, "modified_first_fit_decreasing") == [[0, 4, 1], [2, 5, 3]]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_packs_long_tailed_lengths_within_the_budget(algorithm):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.exp(3 + torch.randn(200, generator=gen)).round().clamp(1, 300).long().tolist()
    bins = pack_lengths(lengths, 300, algorithm)
    _check_bins(bins, lengths, 300)
    lower_bound = -(-sum(lengths) // 300)
    assert len(bins) <= (lower_bound + 2 if algorithm != "concatenative" else 2 * lower_bound + 1)


def test_a_sequence_longer_than_the_budget_is_named():
    with pytest.raises(ValueError, match=r"sequence 1 has 12 real tokens, more than the packing budget of 10"):
        pack_lengths([3, 12], 10, "first_fit_decreasing")


@pytest.mark.parametrize(
    ("name", "message"),
    [("first_fit_shuffle", "is not supported here: an unseeded"), ("best_fit", "is not one of modified_first_fit")],
)
def test_unknown_and_refused_algorithms_are_named(name, message):
    with pytest.raises(ValueError, match=rf"policy.sequence_packing.algorithm: '{name}' {message}"):
        pack_lengths([1], 4, name)


def test_packed_micro_batches_cover_each_rows_tokens_within_the_budget():
    mask = torch.zeros(6, 24, dtype=torch.long)
    for row, (lo, hi) in enumerate([(2, 6), (0, 20), (3, 7), (1, 19), (2, 9), (0, 0)]):
        mask[row, lo:hi] = 1
    parts = packed_micro_batches(mask, max_tokens=24, algorithm="first_fit_decreasing")
    # real tokens 4, 20, 4, 18, 7, 0: 20+4 | 18+4 | 7 (+ the empty row); each window spans its rows' tokens
    assert [(p.rows.tolist(), p.cols) for p in parts] == [([0, 1], slice(0, 20)), ([2, 3], slice(1, 19)),
                                                           ([4, 5], slice(2, 9))]  # fmt: skip
    for part in parts:
        assert int(mask[part.rows].sum()) <= 24
        inside = torch.zeros_like(mask)
        inside[:, part.cols] = 1
        assert bool((mask[part.rows] <= inside[part.rows]).all())
    assert sorted(torch.cat([p.rows for p in parts]).tolist()) == list(range(6))


def test_plan_refuses_packing_with_dynamic_batching():
    pack = {"enabled": True, "train_mb_tokens": None, "algorithm": "first_fit_decreasing"}
    cfg = PolicyConfig(
        train_micro_batch_size=2, logprob_batch_size=2, max_total_sequence_length=8, sequence_packing=pack
    )
    mask = torch.ones(5, 8, dtype=torch.long)
    parts = plan_micro_batches(mask, cfg, "train")  # null budget: 2 x 8 tokens
    assert [len(p) for p in parts] == [2, 2, 1]
    cfg.dynamic_batching.enabled = True  # past the section's rule (the same refusal), as code can set it
    with pytest.raises(ValueError, match="exclude each other"):
        plan_micro_batches(mask, cfg, "train")


def _policies(precision: str, packing: dict):
    """(padded, packed) policies on the same tiny weights, and the loss."""
    base = ["grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4", "policy.train_micro_batch_size=8",
            "policy.logprob_batch_size=8", "policy.optimizer.lr=1e-3", "policy.generation.kv_cache_dtype=auto",
            "policy.fp8_cfg.train_kv_fake_quant=false", "policy.prev_logprobs_source=logprob_forward",
            f"policy.precision={precision}", f"policy.generation.precision={precision}",
            "policy.compute_dtype=float32"]  # fmt: skip
    model, tok = load_model_and_tokenizer("tiny-arith", device=torch.device("cpu"), dtype=torch.float32)
    out = []
    for extra in ([], [f"policy.sequence_packing.{k}={v}" for k, v in packing.items()]):
        cfg = validate_config(load_config(CONFIG, base + extra))
        recipe = PrecisionRecipe.from_config(cfg.policy)
        out.append(NativePolicy(cfg.policy, recipe, torch.device("cpu"), model=copy.deepcopy(model), tokenizer=tok))
    return (*out, ClippedPGLossFn(cfg.loss_fn))


def _long_tailed_batch():
    prompts = [3, 5, 2, 4, 6, 3, 5, 4] * 4
    responses = [1, 2, 1, 3, 1, 2, 1, 14, 2, 1, 3, 1, 1, 2, 1, 1, 12, 1, 2, 1, 1, 3, 1, 1, 2, 1, 9, 1, 1, 2, 1, 1]
    return make_batch(32, 3, prompts, responses, 20)


PACKING = {"enabled": "true", "train_mb_tokens": 64, "logprob_mb_tokens": 96, "sequence_length_round": 16}


def _grads(policy: NativePolicy) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])


def test_packed_passes_give_the_padded_passes_numbers():
    padded, packed, loss_fn = _policies("bf16", PACKING)
    batch = _long_tailed_batch()
    parts = plan_micro_batches(batch.attention_mask, packed.cfg, "train")
    assert len(parts) == 4 and all(int(batch.attention_mask[p.rows].sum()) <= 64 for p in parts)
    lp_padded, lp_packed = padded.get_logprobs(batch), packed.get_logprobs(batch)
    real = batch.attention_mask.bool()
    assert torch.equal(lp_packed[~real], torch.zeros_like(lp_packed[~real]))
    torch.testing.assert_close(lp_packed, lp_padded, rtol=0, atol=2e-5)  # measured 1.9e-6: fp32 sums of other shapes
    a, b = batch.select(slice(None)), batch.select(slice(None))
    a.prev_logprobs, b.prev_logprobs = lp_padded, lp_padded.clone()
    m_padded, m_packed = padded.train(a, loss_fn), packed.train(b, loss_fn)
    assert m_packed["num_micro_batches"] == 4 and m_padded["num_micro_batches"] == 4
    assert m_packed["loss"] == pytest.approx(m_padded["loss"], rel=1e-4, abs=1e-6)  # one global normalizer
    assert m_packed["grad_norm"] == pytest.approx(m_padded["grad_norm"], rel=1e-4) and m_padded["grad_norm"] > 0
    for (name, p), q in zip(padded.model.named_parameters(), packed.model.parameters()):  # the step's gradients
        assert float((q.grad - p.grad).norm()) <= 1e-5 * float(p.grad.norm()) + 1e-9, name


def test_packed_fp8_is_as_accurate_as_padded_fp8():
    """FP8 FProp sees the same per-token 1x128 groups (logprobs agree to float noise); WGrad's 128-token groups
    gather other tokens, so the gradients differ by FP8 rounding, no more than padded FP8 differs from BF16."""
    padded, packed, loss_fn = _policies("fp8", PACKING)
    exact, _, _ = _policies("bf16", {})
    batch = _long_tailed_batch()
    lp = exact.get_logprobs(batch)
    lp_padded, lp_packed = padded.get_logprobs(batch), packed.get_logprobs(batch)
    torch.testing.assert_close(lp_packed, lp_padded, rtol=0, atol=2e-5)
    grads = []
    for policy, prev in ((exact, lp), (padded, lp_padded), (packed, lp_padded)):  # ratio 1: no token clipped
        step = batch.select(slice(None))
        step.prev_logprobs = prev.clone()
        policy.train(step, loss_fn)
        grads.append(_grads(policy))
    ref, g_padded, g_packed = grads
    err_padded = float((g_padded - ref).norm() / ref.norm())
    err_packed = float((g_packed - ref).norm() / ref.norm())
    # measured: padded 0.199, packed 0.199 from the exact gradient; packed vs padded 0.020
    assert 0 < err_padded < 0.3 and err_packed <= 1.1 * err_padded, (err_packed, err_padded)
    assert float((g_packed - g_padded).norm() / g_padded.norm()) < 0.25 * err_padded


def test_train_forward_fills_each_row_with_its_own_packed_logprobs():
    padded, packed, loss_fn = _policies("bf16", PACKING)
    packed.cfg.prev_logprobs_source = "train_forward"
    batch = _long_tailed_batch()
    expected = padded.get_logprobs(batch)
    packed.train([batch], loss_fn)  # prev_logprobs filled in place from the packed training forward
    torch.testing.assert_close(batch.prev_logprobs, expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_the_fixed_layout_a_captured_micro_batch_replays_gives_each_bins_numbers(precision):
    """`policy.train_cuda_graphs` with packing runs every bin in one layout (`fixed_packed_window`): rows padded to
    a power of two, columns to a fixed width, the packed row to the whole budget. Each bin's logprobs, loss and
    gradients are those of its own packed row."""
    _, packed, loss_fn = _policies(precision, PACKING)
    model = packed.model
    batch = _long_tailed_batch()
    batch.prev_logprobs = batch.generation_logprobs + 0.01 * batch.response_mask
    normalizer = loss_fn.normalizer(batch)
    shapes, padded_slots = set(), 0
    for part in plan_micro_batches(batch.attention_mask, packed.cfg, "train"):
        window = batch.window(part.rows, part.cols)
        fixed, packing, own = fixed_packed_window(window, 256, 16, 24)  # slots: multiples of 256 / 8
        rows, real = fixed.input_ids.shape[0], int(window.attention_mask.sum())
        assert rows >= max(8, len(part)) and rows & (rows - 1) == 0 and fixed.input_ids.shape[1] == 24
        assert packing.width == -(-real // 32) * 32  # bins of 33-64 tokens: 64 slots
        padded_slots += packing.width - real
        # segments: one per row, then the rounding slots' in pieces of at most 24
        assert len(packing.cu_seqlens) == rows + -(-packing.width // 24) + 1 and packing.max_seqlen == 24
        shapes.add((*fixed.input_ids.shape, packing.width))
        results = []
        for mb, kwargs in ((window, {"pack_round": 16}), (fixed, {"packing": packing})):
            model.zero_grad(set_to_none=True)
            logp = sequence_logprobs(model, mb.input_ids, mb.attention_mask, **kwargs)
            loss, metrics = loss_fn(logp, mb, normalizer)
            loss.backward()
            results.append((logp.detach(), loss.detach(), metrics, _grads(packed)))
        (lp, loss, metrics, grads), (lp_f, loss_f, metrics_f, grads_f) = results
        assert torch.count_nonzero(lp_f) == torch.count_nonzero(lp_f[own]) > 0  # nothing outside the bin's own
        torch.testing.assert_close(lp_f[own], lp, rtol=0, atol=2e-5)
        assert float(loss) != 0 and float(loss_f) == pytest.approx(float(loss), rel=1e-4, abs=1e-7)
        for name in ("num_valid_tokens", "num_valid_samples", "probs_ratio", "clip_fraction"):
            assert float(metrics_f[name]) == pytest.approx(float(metrics[name]), rel=1e-4), name
        bound = 1e-4 if precision == "bf16" else 0.05  # FP8: WGrad's 128-token groups hold more pad slots
        assert float((grads_f - grads).norm()) <= bound * float(grads.norm()), precision
    assert {(r, w) for r, w, _ in shapes} == {(8, 24), (16, 24)}  # bins of <= 8 and of 9-16 sequences
    assert len(shapes) < 4 and padded_slots > 0  # four bins in fewer layouts
