"""Dynamic batching (`policy.dynamic_batching`): the planner's micro-batches, and the trainer's passes over them equal
the fixed micro-batches' on the tiny model (exact FP8 emulation on CPU)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from jetrl_testkit.reference_step import make_batch

from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.policy.micro_batches import fixed_micro_batches, plan_micro_batches, token_budget_micro_batches
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"


def _mask(spans: list[tuple[int, int]], width: int) -> torch.Tensor:
    """[B, width] attention mask with real tokens at columns [lo, hi) of each row."""
    mask = torch.zeros(len(spans), width, dtype=torch.long)
    for row, (lo, hi) in enumerate(spans):
        mask[row, lo:hi] = 1
    return mask


def test_token_budget_packs_longest_first_and_trims_each_window():
    # prompts left-padded to column 4; responses end at 6, 20, 7, 19, 9 (long-tailed), one row all padding
    mask = _mask([(2, 6), (0, 20), (3, 7), (1, 19), (2, 9), (0, 0)], 24)
    parts = token_budget_micro_batches(mask, max_tokens=40, round_to=4)
    assert [p.rows.tolist() for p in parts] == [[1, 3], [4, 2, 0, 5]]
    assert [(p.cols.start, p.cols.stop) for p in parts] == [(0, 20), (1, 9)]  # widths 20 and 8 (rounded up to 4)
    for part in parts:  # each micro-batch within the budget, every real token of its rows inside its window
        assert len(part) * (part.cols.stop - part.cols.start) <= 40
        inside = torch.zeros_like(mask)
        inside[:, part.cols] = 1
        assert bool((mask[part.rows] <= inside[part.rows]).all())
    rows = torch.cat([p.rows for p in parts])
    assert sorted(rows.tolist()) == list(range(6))  # every row exactly once


def test_a_row_wider_than_the_budget_forms_its_own_micro_batch():
    parts = token_budget_micro_batches(_mask([(0, 10), (0, 3)], 10), max_tokens=4, round_to=1)
    assert [(p.rows.tolist(), p.cols.stop - p.cols.start) for p in parts] == [([0], 10), ([1], 3)]


def test_rounding_widens_with_pad_columns_within_the_batch():
    parts = token_budget_micro_batches(_mask([(5, 8)], 9), max_tokens=100, round_to=8)
    assert (parts[0].cols.start, parts[0].cols.stop) == (0, 8)  # widened to the left: columns 0-4 are pads
    parts = token_budget_micro_batches(_mask([(1, 3)], 9), max_tokens=100, round_to=8)
    assert (parts[0].cols.start, parts[0].cols.stop) == (0, 8)


def test_disabled_is_the_fixed_row_chunks():
    sizes = dict(train_micro_batch_size=3, logprob_batch_size=4, max_total_sequence_length=10)
    mask = _mask([(0, 5)] * 7, 10)
    fixed = plan_micro_batches(mask, PolicyConfig(**sizes), "train")
    assert [p.rows.tolist() for p in fixed] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [p.rows.tolist() for p in fixed_micro_batches(7, 4, 10)] == [[0, 1, 2, 3], [4, 5, 6]]
    dyn = PolicyConfig(**sizes, dynamic_batching={"enabled": True, "sequence_length_round": 1})
    parts = plan_micro_batches(mask, dyn, "train")  # null budget: 3 rows x 10 tokens
    assert [len(p) for p in parts] == [6, 1] and parts[0].cols == slice(0, 5)


def _policies(dynamic: dict):
    """(fixed, dynamic) policies on the same tiny weights, and the loss. FP32 math: in FP8 a last-bit difference of
    an FP32 GEMM of another shape ahead of an activation quantizer can flip an e4m3 code (docs/mismatch.md), which
    would hide what is compared here (the cutting into micro-batches and the row mapping)."""
    base = ["grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=4", "policy.train_micro_batch_size=8",
            "policy.logprob_batch_size=8", "policy.optimizer.lr=1e-3", "policy.generation.kv_cache_dtype=auto",
            "policy.fp8_cfg.train_kv_fake_quant=false", "policy.prev_logprobs_source=logprob_forward",
            "policy.precision=bf16", "policy.generation.precision=bf16", "policy.compute_dtype=float32"]  # fmt: skip
    model, tok = load_model_and_tokenizer("tiny-arith", device=torch.device("cpu"), dtype=torch.float32)
    out = []
    for extra in ([], [f"policy.dynamic_batching.{k}={v}" for k, v in dynamic.items()]):
        cfg = validate_config(load_config(CONFIG, base + extra))
        recipe = PrecisionRecipe.from_config(cfg.policy)
        policy = NativePolicy(cfg.policy, recipe, torch.device("cpu"), model=copy.deepcopy(model), tokenizer=tok)
        out.append(policy)
    return (*out, ClippedPGLossFn(cfg.loss_fn))


def _long_tailed_batch():
    prompts = [3, 5, 2, 4, 6, 3, 5, 4] * 4
    responses = [1, 2, 1, 3, 1, 2, 1, 14, 2, 1, 3, 1, 1, 2, 1, 1, 12, 1, 2, 1, 1, 3, 1, 1, 2, 1, 9, 1, 1, 2, 1, 1]
    return make_batch(32, 3, prompts, responses, 20)


def test_dynamic_batching_gives_the_fixed_passes_numbers():
    fixed, dynamic, loss_fn = _policies({"enabled": "true", "train_mb_tokens": 64, "logprob_mb_tokens": 96,
                                         "sequence_length_round": 4})  # fmt: skip
    batch = _long_tailed_batch()
    parts = plan_micro_batches(batch.attention_mask, dynamic.cfg, "train")
    widths = [p.cols.stop - p.cols.start for p in parts]
    assert len(parts) > 4 and min(widths) < 12 < max(widths)  # several windows, short ones among them
    computed = sum(len(p) * w for p, w in zip(parts, widths))
    assert computed < 0.6 * batch.input_ids.numel()  # padding columns left out
    lp_fixed, lp_dynamic = fixed.get_logprobs(batch), dynamic.get_logprobs(batch)
    real = batch.attention_mask.bool()
    assert torch.equal(lp_dynamic[~real], torch.zeros_like(lp_dynamic[~real]))
    torch.testing.assert_close(lp_dynamic, lp_fixed, rtol=0, atol=2e-5)  # fp32 GEMMs of other shapes
    a, b = batch.select(slice(None)), batch.select(slice(None))
    a.prev_logprobs, b.prev_logprobs = lp_fixed, lp_fixed.clone()
    m_fixed, m_dynamic = fixed.train(a, loss_fn), dynamic.train(b, loss_fn)
    assert m_dynamic["loss"] == pytest.approx(m_fixed["loss"], rel=1e-4, abs=1e-6)  # one global normalizer
    assert m_dynamic["grad_norm"] == pytest.approx(m_fixed["grad_norm"], rel=1e-4) and m_fixed["grad_norm"] > 0
    for (name, p), q in zip(fixed.model.named_parameters(), dynamic.model.parameters()):  # the step's gradients
        assert float((q.grad - p.grad).norm()) <= 1e-5 * float(p.grad.norm()) + 1e-9, name


def test_train_forward_fills_each_row_with_its_own_logprobs():
    fixed, dynamic, loss_fn = _policies({"enabled": "true", "train_mb_tokens": 64, "sequence_length_round": 1})
    dynamic.cfg.prev_logprobs_source = "train_forward"
    batch = _long_tailed_batch()
    expected = fixed.get_logprobs(batch)
    dynamic.train([batch], loss_fn)  # prev_logprobs filled in place, row by row, from the training forward
    torch.testing.assert_close(batch.prev_logprobs, expected, rtol=0, atol=2e-5)
