"""Activation checkpointing (`policy.dtensor_cfg.activation_checkpointing`, models/recompute.py) changes memory, not
numbers: with the FP8 recipe (+ FP8 KV fake-quant and the fused KV-scale calibration), padded and packed, the loss,
every gradient, the FP8 weight bits and the calibrator's records are bitwise those of the step without it, the FP8
weights are quantized as often (once per step), and the layers really are recomputed. (The memory it saves is
measured on CUDA: tests/gpu/test_activation_checkpointing_gpu.py.)"""

from __future__ import annotations

import copy
import gc
import weakref
from pathlib import Path

import pytest
import torch
from jetrl_testkit.reference_step import make_batch

from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, convert_to_fp8, fp8_layers, use_transient_fp8_weights
from nemo_jetrl.precision.kv import QKVCalibrator, make_attn_hook
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"  # unified FP8 + FP8 KV
PROMPT_LENS, RESP_LENS, SEQ = [3, 5, 2, 4, 6, 3], [5, 2, 4, 1, 3, 5], 12


def _batch():
    return make_batch(32, 1, PROMPT_LENS, RESP_LENS, SEQ)


def _fp8_model():
    model = random_tiny_qwen3(0, num_layers=2).train()
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl_kv"))
    return model


def _fp8_bits(model) -> dict:
    """Each FP8 linear's weight bits (as bytes) and scales, quantized now."""
    return {n: (m.quantized_weight().data.view(torch.uint8).clone(), m.quantized_weight().scale.clone())
            for n, m in fp8_layers(model)}  # fmt: skip


def _step(model, checkpointing: bool, pack_round: int | None, calls: list[str]) -> dict:
    """One forward + backward of a weighted logprob sum with the FP8 KV fake-quant and a calibrator on."""
    batch = _batch()
    calibrator = QKVCalibrator(2)
    scales = QKVCalibrator(2)
    with torch.no_grad():
        sequence_logprobs(model, batch.input_ids, batch.attention_mask, attn_hook=scales, compute_dtype=torch.bfloat16)
    hook = make_attn_hook(calibrator, scales.scales())
    logp = sequence_logprobs(
        model, batch.input_ids, batch.attention_mask, attn_hook=hook, compute_dtype=torch.bfloat16,
        pack_round=pack_round, activation_checkpointing=checkpointing,
    )  # fmt: skip
    loss = (logp * batch.response_mask * batch.advantages[:, None]).sum()
    down = model.model.layers[0].mlp.down_proj
    forward = down.forward
    down.forward = lambda x: calls.append("down_proj") or forward(x)  # counts the backward's forwards
    loss.backward()
    del down.forward
    return {
        "loss": loss.detach(),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
        "bits": _fp8_bits(model),
        "records": [r.clone() for r in calibrator._records],
    }


@pytest.mark.parametrize("pack_round", [None, 8], ids=["padded", "packed"])
def test_checkpointed_fp8_step_is_bitwise_the_plain_one(pack_round, monkeypatch):
    quantized = []
    original = Fp8Linear.quantize_weight
    monkeypatch.setattr(Fp8Linear, "quantize_weight", lambda self: quantized.append(1) or original(self))
    base = _fp8_model()
    runs = {}
    for flag in (False, True):
        quantized.clear()
        calls = []
        runs[flag] = _step(copy.deepcopy(base), flag, pack_round, calls)
        runs[flag]["quantizations"], runs[flag]["backward_forwards"] = len(quantized), len(calls)
    plain, ckpt = runs[False], runs[True]
    assert torch.equal(ckpt["loss"], plain["loss"]) and plain["loss"].abs() > 0
    assert ckpt["grads"].keys() == plain["grads"].keys() and len(plain["grads"]) == 24
    for name, grad in plain["grads"].items():
        assert torch.equal(ckpt["grads"][name], grad), name
    assert float(sum(g.abs().sum() for g in plain["grads"].values())) > 0
    assert len(plain["bits"]) == 14  # 2 layers x 7 FP8 linears
    for name, (data, scale) in plain["bits"].items():
        assert torch.equal(ckpt["bits"][name][0], data) and torch.equal(ckpt["bits"][name][1], scale), name
    # one quantization per FP8 weight in both (the recomputed forward reads the cache), one calibration record
    assert ckpt["quantizations"] == plain["quantizations"] == 14
    assert len(ckpt["records"]) == len(plain["records"]) == 1
    assert torch.equal(ckpt["records"][0], plain["records"][0]) and bool((plain["records"][0] > 0).all())
    assert (plain["backward_forwards"], ckpt["backward_forwards"]) == (0, 1)  # recomputed in the backward


def _policy(checkpointing: bool, packed: bool, transient: bool = False) -> NativePolicy:
    overrides = [
        f"policy.fp8_cfg.transient_train_weights={str(transient).lower()}",
        f"policy.dtensor_cfg.activation_checkpointing={str(checkpointing).lower()}",
        f"policy.sequence_packing.enabled={str(packed).lower()}",
        "policy.train_micro_batch_size=3",
        "policy.sequence_packing.train_mb_tokens=32",
        "policy.logprob_batch_size=3",
        "policy.optimizer.lr=1e-3",
        "grpo.num_prompts_per_step=6",
        "grpo.num_generations_per_prompt=1",
    ]
    cfg = validate_config(load_config(CONFIG, overrides))
    torch.manual_seed(0)
    policy = NativePolicy(
        cfg.policy, PrecisionRecipe.from_config(cfg.policy), torch.device("cpu"),
        model=random_tiny_qwen3(0, num_layers=2).train(), tokenizer=None,
    )  # fmt: skip
    policy.calibrate_kv_scales(_batch())
    return policy


@pytest.mark.parametrize("transient", [False, True], ids=["cached", "transient"])
def test_the_trainer_honours_the_key_with_the_same_step(transient):
    """The NeMo-RL key reaches the trainer (packed, train_forward prev_logprobs, fused KV calibration, 2
    micro-batches): prev_logprobs, metrics, updated weights and the next KV scales equal the plain trainer's; also
    with `fp8_cfg.transient_train_weights` (which switches the checkpointed trainer's FP8 linears only)."""
    loss_fn = ClippedPGLossFn(validate_config(load_config(CONFIG)).loss_fn)
    policies = {flag: _policy(flag, packed=True, transient=transient) for flag in (False, True)}
    assert [p.kernels["activation_checkpointing"] for p in policies.values()] == [False, True]
    switched = [{m.transient_weight for _, m in fp8_layers(p.model)} for p in policies.values()]
    assert switched == [{False}, {transient}]
    out = {}
    for flag, policy in policies.items():
        batch = _batch()
        metrics = policy.train([batch], loss_fn)
        policy.prepare_refit()
        out[flag] = (batch.prev_logprobs, metrics, policy.model.state_dict(), policy.kv_scales)
    (lp0, m0, sd0, kv0), (lp1, m1, sd1, kv1) = out[False], out[True]
    assert torch.equal(lp0, lp1) and m0 == m1 and m0["grad_norm"] > 0 and m0["num_micro_batches"] == 2
    for name, value in sd0.items():
        assert torch.equal(sd1[name], value), name
    for part in ("q", "k", "v"):
        assert torch.equal(getattr(kv0, part), getattr(kv1, part)), part


@pytest.mark.parametrize("pack_round", [None, 8], ids=["padded", "packed"])
def test_transient_fp8_weights_are_bitwise_the_cached_ones_and_live_one_layer_at_a_time(pack_round, monkeypatch):
    """`use_transient_fp8_weights` (`fp8_cfg.transient_train_weights`, checkpointed eager training): the step's loss, gradients and
    FP8 bits equal the cached run's; no FP8 weight quantized in the forward outlives it (neither the layers nor the
    autograd graph hold one: the backward keeps the bits as saved tensors, which checkpointing recomputes), and
    while the backward runs at most one layer's linears (7) hold theirs."""
    made, held_at_quantization = [], []
    base = _fp8_model()
    original = Fp8Linear.set_quantized_weight

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(weakref.ref(self._qweight))
        held_at_quantization.append(sum(m.cached_quantized_weight is not None for _, m in fp8_layers(self_model[0])))

    monkeypatch.setattr(Fp8Linear, "set_quantized_weight", record)
    self_model: list = [None]
    runs = {}
    for transient in (False, True):
        model = copy.deepcopy(base)
        self_model[0] = model
        switched = use_transient_fp8_weights(model) if transient else 0
        made.clear(), held_at_quantization.clear()
        batch = _batch()
        logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, compute_dtype=torch.bfloat16,
                                 pack_round=pack_round, activation_checkpointing=True)  # fmt: skip
        loss = (logp * batch.response_mask * batch.advantages[:, None]).sum()
        gc.collect()
        alive_after_forward = sum(r() is not None for r in made)
        forward_made = len(made)
        loss.backward()
        runs[transient] = {
            "switched": switched, "loss": loss.detach(), "alive": alive_after_forward, "forward_made": forward_made,
            "held_in_backward": max(held_at_quantization[forward_made:], default=0),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            "bits": _fp8_bits(model),
        }
    cached, transient = runs[False], runs[True]
    assert (cached["switched"], transient["switched"]) == (0, 14)
    assert torch.equal(transient["loss"], cached["loss"]) and cached["loss"].abs() > 0
    for name, grad in cached["grads"].items():
        assert torch.equal(transient["grads"][name], grad), name
    for name, (data, scale) in cached["bits"].items():
        assert torch.equal(transient["bits"][name][0], data) and torch.equal(transient["bits"][name][1], scale), name
    assert cached["forward_made"] == transient["forward_made"] == 14  # each weight quantized once in the forward
    assert cached["alive"] == 14 and transient["alive"] == 0  # the cache, or nothing, holds them after the forward
    assert 1 <= transient["held_in_backward"] <= 7  # the recomputed layer's own, released after it


def test_each_checkpointed_layer_keeps_one_residual_tensor(monkeypatch):
    """A checkpoint keeps its inputs until the backward: each layer gets the residual sum made before it, one
    [B, S, H] tensor (and no delta), not the residual and the branch output apart (two)."""
    from nemo_jetrl.models import recompute

    inputs = []
    checkpoint = recompute.checkpoint

    def spy(fn, *args, **kwargs):
        inputs.append([None if a is None else tuple(a.shape) for a in args])
        return checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(recompute, "checkpoint", spy)
    model = random_tiny_qwen3(0, num_layers=3).train()
    batch = _batch()
    logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, activation_checkpointing=True)
    logp.sum().backward()
    rows, cols, hidden = *batch.input_ids.shape, model.config.hidden_size
    assert inputs[:3] == [[(rows, cols, hidden), None]] * 3  # the decoder layers' (x, delta); then logits chunks'
