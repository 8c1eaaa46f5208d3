"""The `matched_kernels: auto` start-up self-check (models/matched_check.py): row invariance of fake GEMMs, of the
tiny model's products in the exact mode (batch-invariant by construction), and the refusal of a GEMM that splits K
by the number of rows."""

from __future__ import annotations

import pytest
import torch
from jetrl_testkit.fake_gemms import patch_fp8_gemm, split_k_by_m

from nemo_jetrl.models import matched_check
from nemo_jetrl.models.batch_invariant import enable_batch_invariant
from nemo_jetrl.models.matched_check import (
    CHECK_ROWS,
    Product,
    matched_kernels_problem,
    model_products,
    row_invariance_problem,
)
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.gemm import fp8_blockwise_mm

W = torch.randn(48, 512, generator=torch.Generator().manual_seed(0))  # [N, K]
X = torch.randn(1024, 512, generator=torch.Generator().manual_seed(1))  # [R, K]


def exact(x: torch.Tensor) -> list[torch.Tensor]:
    return [(x.double() @ W.double().t()).float()]  # float64 products of float32 values, rounded once


def split_by_rows(x: torch.Tensor) -> list[torch.Tensor]:
    if x.shape[0] <= 64:
        return [x @ W.t()]
    return [x[:, :256] @ W[:, :256].t() + x[:, 256:] @ W[:, 256:].t()]  # float32 partial sums added


def test_a_row_invariant_product_passes_and_a_split_k_one_is_named():
    assert row_invariance_problem(Product("exact", 512, 48, exact, exact), X) is None
    problem = row_invariance_problem(Product("fake gemm", 512, 48, split_by_rows, split_by_rows), X)
    assert problem == "fake gemm: the rollout's rows of a 1-row product differ from the same rows in 1024 rows"


def test_a_trainer_forward_that_changes_with_autograd_is_named():
    def graded(x):
        return [exact(x)[0] + (1e-3 if torch.is_grad_enabled() else 0.0)]

    problem = row_invariance_problem(Product("grad", 512, 48, exact, graded), X)
    assert problem == "grad: the trainer's forward with and without gradient differ"


def _exact_fp8_model():
    model = random_tiny_qwen3(0, num_layers=2)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    enable_batch_invariant(model)  # the exact mode: every product's twin is batch-invariant by construction
    return model


def test_the_tiny_models_products_are_listed_once_per_kind_and_shape():
    names = [p.name for p in model_products(_exact_fp8_model(), torch.bfloat16)]
    # layer 1 repeats layer 0's shapes; the lm_head is the last product
    assert names == ["layers.0.self_attn.q/k/v_proj", "layers.0.self_attn.o_proj", "layers.0.mlp.gate/up_proj",
                     "layers.0.mlp.down_proj", "lm_head"]  # fmt: skip
    assert min(CHECK_ROWS) == 1  # one row alone against the same row in a batch


def test_the_exact_mode_passes_and_a_gemm_splitting_k_by_m_is_refused(monkeypatch):
    monkeypatch.setattr(matched_check, "REFERENCE_ROWS", 640)  # the float64 twins: fewer rows, same comparisons
    model = _exact_fp8_model()
    assert matched_kernels_problem(model, torch.bfloat16, kv_fp8=True) is None
    assert patch_fp8_gemm(monkeypatch, split_k_by_m(fp8_blockwise_mm)) >= 1
    problem = matched_kernels_problem(model, torch.bfloat16)
    assert problem is not None and problem.startswith("layers.0.self_attn.q/k/v_proj: the rollout's rows of a ")
    assert problem.endswith("-row product differ from the same rows in 640 rows")  # (seen: 61 rows)


@pytest.mark.parametrize("part", ["attention", "logprob"])
def test_a_batch_variant_attention_or_logprob_is_refused(monkeypatch, part):
    from nemo_jetrl.models import batch_invariant_train

    model = random_tiny_qwen3(0, num_layers=1)
    enable_batch_invariant(model)
    monkeypatch.setattr(matched_check, "model_products", lambda *a: [])  # the attention and the logprob alone
    if part == "attention":  # a decode step whose bits are not the trainer's query's
        real = batch_invariant_train.causal_attention
        monkeypatch.setattr(batch_invariant_train, "causal_attention", lambda *a: real(*a) * (1 + 2**-6))
        expected = "attention: the prefill's queries differ from the trainer's"
    else:  # a logprob whose rows see the batch size
        real = matched_check.token_logprobs
        monkeypatch.setattr(matched_check, "token_logprobs", lambda x, *a, **k: real(x, *a, **k) + x.shape[0] * 1e-3)
        expected = "logprob: a row alone differs from the same row in a batch of 8"
    assert matched_check.matched_kernels_problem(model, torch.bfloat16) == expected
