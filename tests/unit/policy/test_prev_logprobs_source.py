"""`policy.prev_logprobs_source: train_forward`: prev_logprobs come from the training forward itself (one forward
less per GRPO step). On the CPU exact path the step must equal the logprob_forward step bit for bit: the same
prev_logprobs, the same parameters after the update, the same FP8 KV scales for the next rollout."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from jetrl_testkit.cli import load_script, run_main
from jetrl_testkit.reference_step import make_batch

from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.policy.native import NativePolicy, NonFiniteError
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"  # unified FP8 + FP8 KV
LOSS_FN = ClippedPGLossFn(validate_config(load_config(CONFIG)).loss_fn)
PROMPT_LENS, RESP_LENS, SEQ = [3, 5, 2, 4, 6, 3, 5, 4], [5, 2, 4, 1, 3, 5, 4, 2], 12


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-arith", device=torch.device("cpu"), dtype=torch.float32)


def _policy(tiny, source: str, mbs: int, logprob_bs: int = 8) -> NativePolicy:
    overrides = [
        f"policy.prev_logprobs_source={source}",
        "grpo.num_prompts_per_step=8",
        "grpo.num_generations_per_prompt=1",
        f"policy.train_micro_batch_size={mbs}",
        f"policy.logprob_batch_size={logprob_bs}",
        "policy.optimizer.lr=1e-3",
    ]
    cfg = validate_config(load_config(CONFIG, overrides))
    model, tok = tiny
    policy = NativePolicy(
        cfg.policy,
        PrecisionRecipe.from_config(cfg.policy),
        torch.device("cpu"),
        model=copy.deepcopy(model),
        tokenizer=tok,
    )
    policy.calibrate_kv_scales(_batch())  # the bootstrap scales the first rollout would run with
    return policy


def _batch():
    return make_batch(32, 1, PROMPT_LENS, RESP_LENS, SEQ)


@pytest.mark.parametrize(("mbs", "logprob_bs"), [(8, 8), (4, 4), (4, 8), (2, 3)])
def test_train_forward_step_equals_logprob_forward_step_bitwise(tiny, mbs, logprob_bs):
    ref = _policy(tiny, "logprob_forward", mbs, logprob_bs)
    fused = _policy(tiny, "train_forward", mbs, logprob_bs)
    batch_ref, batch_fused = _batch(), _batch()
    batch_ref.prev_logprobs = ref.get_logprobs(batch_ref)
    metrics_ref = ref.train([batch_ref], LOSS_FN)
    metrics_fused = fused.train([batch_fused], LOSS_FN)

    assert torch.equal(batch_fused.prev_logprobs, batch_ref.prev_logprobs)  # filled in place by the forward
    assert float(batch_ref.prev_logprobs[batch_ref.response_mask.bool()].abs().min()) > 0  # real logprobs
    assert metrics_fused["loss"] == metrics_ref["loss"]
    assert metrics_fused["grad_norm"] == metrics_ref["grad_norm"] > 0
    for (name, p_ref), p_fused in zip(ref.model.named_parameters(), fused.model.parameters()):
        assert torch.equal(p_ref, p_fused), name
    ref.prepare_refit(), fused.prepare_refit()  # next rollout's KV scales: observed in the respective forward
    if mbs != logprob_bs:  # the calibration takes a percentile over micro-batch amaxes: partitions must match
        return
    for part in ("q", "k", "v"):
        assert torch.equal(getattr(fused.kv_scales, part), getattr(ref.kv_scales, part)), part


def test_without_prev_logprobs_the_logprob_forward_policy_names_the_key(tiny):
    with pytest.raises(ValueError, match="policy.prev_logprobs_source: train_forward"):
        _policy(tiny, "logprob_forward", 8).train([_batch()], LOSS_FN)


def test_train_forward_needs_one_optimizer_step(tiny):
    policy = _policy(tiny, "train_forward", 4)
    halves = [_batch().select(slice(0, 4)), _batch().select(slice(4, 8))]
    with pytest.raises(ValueError, match="one optimizer step, got 2"):
        policy.train(halves, LOSS_FN)


def test_nonfinite_trainer_logprobs_stop_the_step_before_the_update(tiny):
    policy = _policy(tiny, "train_forward", 4)
    policy.scorer.temperature = 1e-45  # logits / T overflow: -inf / NaN logprobs on the generated tokens
    before = [p.detach().clone() for p in policy.model.parameters()]
    # micro-batch 0 (rows 0-3) holds 5 + 2 + 4 + 1 generated tokens
    with pytest.raises(NonFiniteError, match=r"non-finite trainer logprobs \(12 of 12 generated tokens\)"):
        policy.train([_batch()], LOSS_FN)
    assert all(torch.equal(a, p) for a, p in zip(before, policy.model.parameters()))
    assert policy.step == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["policy.train_global_batch_size=128"], "needs one optimizer step per GRPO step"),
    ],
)
def test_config_refuses_train_forward_where_it_cannot_hold(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(CONFIG, ["policy.prev_logprobs_source=train_forward", *overrides]))


@pytest.mark.parametrize(
    ("overrides", "resolved"),
    [
        ([], "train_forward"),  # grpo_tiny: one optimizer step per GRPO step
        (["policy.train_global_batch_size=128"], "logprob_forward"),
        (["cluster.backend=ray", "cluster.cpu_workers_per_node=2"], "train_forward"),  # every backend
    ],
)
def test_auto_takes_the_training_forward_only_where_it_holds(overrides, resolved):
    cfg = validate_config(load_config(CONFIG, ["policy.prev_logprobs_source=auto", *overrides]))
    assert cfg.policy.prev_logprobs_source == resolved


def test_fp8_weights_follow_a_fused_optimizer_step(tiny):
    """The fused AdamW (CUDA's default here) writes master weights without bumping `_version`: the trainer must
    still serve FP8 weights of the updated master after the step (weight_quant of the new weights, bitwise)."""
    from nemo_jetrl.precision import Fp8Linear, weight_quant

    policy = _policy(tiny, "logprob_forward", 8)
    opt = policy.optimizer
    policy.optimizer = torch.optim.AdamW(opt.param_groups[0]["params"], lr=1e-3, fused=True)
    layers = [m for m in policy.model.modules() if isinstance(m, Fp8Linear) and m.train_fp8]
    before = [m.weight._version for m in layers]
    batch = _batch()
    batch.prev_logprobs = policy.get_logprobs(batch)
    policy.train(batch, LOSS_FN)
    policy.prepare_refit()
    assert [m.weight._version for m in layers] == before  # the fused step bumped no version
    for m in layers:
        qw = m.quantized_weight()
        data, scale = weight_quant(m.weight.detach(), 128)
        assert torch.equal(qw.data.view(torch.uint8), data.view(torch.uint8)) and torch.equal(qw.scale, scale)


def test_train_releases_the_cached_blocks_of_the_pass_before_once(tiny, monkeypatch):
    """train() starts by giving the logprob pass's cached blocks back (CUDA: empty_cache), once per call."""
    released = []
    monkeypatch.setattr("nemo_jetrl.policy.native.release_cached_memory", released.append)
    policy = _policy(tiny, "logprob_forward", 4)
    batch = _batch()
    batch.prev_logprobs = policy.get_logprobs(batch)
    assert released == []
    policy.train([batch.select(slice(0, 4)), batch.select(slice(4, 8))], LOSS_FN)
    assert released == [policy.device]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ([], True),  # the shipped recipes: one optimizer step per GRPO step -> no logprob pass, said once
        (["policy.train_global_batch_size=128"], False),  # several: NeMo-RL's logprob pass, nothing to say
        (["policy.prev_logprobs_source=train_forward"], False),  # said in the config, not resolved
    ],
)
def test_the_shipped_default_resolves_to_the_training_forward_with_one_line(overrides, line):
    root = CONFIG.parents[2]
    config = root / "examples" / "configs" / "grpo_math_8B_fp8_kv.yaml"
    assert validate_config(load_config(config)).policy.prev_logprobs_source == "train_forward"
    main = load_script(root / "examples" / "run_grpo.py", "run_grpo_prev_logprobs").main
    rc, out, err = run_main(main, ["--config", str(config), "--validate-only", *overrides])
    assert rc == 0 and err == ""
    said = [ln for ln in out.splitlines() if ln.startswith("policy.prev_logprobs_source: auto -> train_forward")]
    assert len(said) == int(line)
    assert out.splitlines()[-1].startswith("precision: train=fp8 rollout=fp8 kv=fp8")
