"""`policy.train_cuda_graphs` off the GPU: the key a captured micro-batch depends on, the refusal on CPU, and the loss's
device-tensor normalizer (what a captured step passes) checked without reading it. The captured steps themselves
are tested against eager ones on CUDA (tests/gpu/test_train_graphs_gpu.py)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from jetrl_testkit.reference_step import make_batch

from nemo_jetrl.algorithms.loss import clipped_pg_loss
from nemo_jetrl.config import load_config
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.policy.train_graphs import batch_key
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"


def _batch(seq: int = 12):
    return make_batch(32, 1, [3, 5, 2, 4], [5, 2, 4, 1], seq)


def test_batch_key_follows_shapes_dtypes_missing_fields_and_flags():
    batch = _batch()
    key = batch_key(batch, False)
    assert key == batch_key(_batch(), False)  # contents do not matter
    assert key != batch_key(batch, True)
    assert key != batch_key(_batch(seq=13), False)
    assert key != batch_key(dataclasses.replace(batch, prev_logprobs=torch.zeros(4, 12)), False)
    assert key != batch_key(dataclasses.replace(batch, advantages=batch.advantages.double()), False)


def test_train_cuda_graphs_on_a_cpu_trainer_is_refused():
    cfg = validate_config(load_config(CONFIG, ["policy.train_cuda_graphs=true"]))
    model, tok = load_model_and_tokenizer("tiny-arith", device=torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(ValueError, match="policy.train_cuda_graphs: true needs a CUDA device"):
        NativePolicy(cfg.policy, PrecisionRecipe.from_config(cfg.policy), torch.device("cpu"),
                     model=copy.deepcopy(model), tokenizer=tok)  # fmt: skip


def test_a_tensor_normalizer_scales_the_loss_like_the_number_and_must_be_one_float():
    batch = _batch()
    cfg = validate_config(load_config(CONFIG)).loss_fn
    logp = (batch.generation_logprobs + 0.1 * batch.response_mask).requires_grad_(True)
    args = (logp, batch.generation_logprobs, batch.generation_logprobs, batch.advantages, batch.response_mask, cfg)
    loss_n, metrics_n = clipped_pg_loss(*args, normalizer=7.0)
    loss_t, metrics_t = clipped_pg_loss(*args, normalizer=torch.tensor(7.0))
    assert loss_n != 0 and torch.allclose(loss_t, loss_n, rtol=1e-6, atol=0)
    assert metrics_t["num_valid_tokens"] == metrics_n["num_valid_tokens"] == 12
    with pytest.raises(ValueError, match="one floating value"):
        clipped_pg_loss(*args, normalizer=torch.tensor([7.0, 1.0]))
    with pytest.raises(ValueError, match="one floating value"):
        clipped_pg_loss(*args, normalizer=torch.tensor(7))
    with pytest.raises(ValueError, match="must be a number > 0"):
        clipped_pg_loss(*args, normalizer=0.0)
