"""The exact mode on the tiny model (CPU twins): the switch, and the rollout's logprobs (prefill + decode of 6 rows)
equal to the trainer's forward bitwise at every trainer micro-batch size, for BF16, unified FP8 and FP8 + KV."""

import pytest
import torch
from torch import nn

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.batch_invariant import (
    MATCHED_PARTS,
    BatchInvariantLinear,
    ExactParts,
    enable_batch_invariant,
    exact_parts,
    is_batch_invariant,
    match_kernels,
    matched_parts,
    unmatch_kernels,
)
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import Fp8Linear, FpropKernel, PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.kv import QKVCalibrator, make_attn_hook

BF16 = torch.bfloat16


def test_switch_covers_every_linear_and_keeps_the_parameters():
    model = random_tiny_qwen3(0)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    head = model.lm_head.weight
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert not is_batch_invariant(model)
    assert enable_batch_invariant(model) == len(fp8) + 1  # the FP8 projections and the lm_head
    assert is_batch_invariant(model) and all(m.fprop_kernel is FpropKernel.BATCH_INVARIANT for m in fp8)
    assert isinstance(model.lm_head, BatchInvariantLinear) and model.lm_head.weight is head
    assert not any(type(m) is nn.Linear for m in model.modules())
    with pytest.raises(ValueError, match="no linear layers"):
        enable_batch_invariant(nn.Sequential(nn.ReLU()))
    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="exact mode refuses it"):
        sequence_logprobs(model, ids, torch.ones_like(ids), causal_attention=True)


def test_exact_parts_name_subsets_and_refuse_unknown_names():
    assert ExactParts().complete and not ExactParts.none().any
    assert ExactParts.only("attention") == ExactParts(fp8_gemm=False, linear=False, attention=True, logsumexp=False)
    assert ExactParts().without("attention", "linear") == ExactParts(linear=False, attention=False)
    with pytest.raises(ValueError, match="unknown exact-mode parts"):
        ExactParts.only("norm")
    with pytest.raises(ValueError, match="no exact-mode part"):
        enable_batch_invariant(random_tiny_qwen3(0), ExactParts.none())


def test_partial_parts_switch_only_their_kernels():
    model = random_tiny_qwen3(0)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert enable_batch_invariant(model, ExactParts.only("fp8_gemm")) == len(fp8)
    assert all(m.fprop_kernel is FpropKernel.BATCH_INVARIANT for m in fp8) and type(model.lm_head) is nn.Linear
    assert exact_parts(model) == ExactParts.only("fp8_gemm") and not is_batch_invariant(model)


def test_matched_kernels_switch_the_cheap_parts_and_the_policy_applies_them():
    from benchmarks.common import policy_config
    from nemo_jetrl.policy.native import NativePolicy

    model = random_tiny_qwen3(0)
    cfg = policy_config(master_dtype="float32", generation={"matched_kernels": True})
    policy = NativePolicy(cfg, PrecisionRecipe.preset("jetrl"), torch.device("cpu"), model=model)
    assert exact_parts(policy.model) == MATCHED_PARTS == ExactParts.only("attention", "logsumexp")
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert fp8 and all(m.fprop_kernel is FpropKernel.AUTO for m in fp8)  # CPU: the emulated GEMM, no cuBLAS
    assert type(model.lm_head) is nn.Linear
    engine = NativeGenerationEngine(model, max_new_tokens=2, stop_token_ids=[], pad_token_id=0)
    assert engine.forward_plan.exact.logsumexp and not is_batch_invariant(model)  # the samplers' per-row log-sum-exp
    other = random_tiny_qwen3(0)
    match_kernels(other, torch.device("cpu"))  # no FP8 linears: attention and log-sum-exp only
    assert exact_parts(other) == MATCHED_PARTS
    # CUDA: the fast path's per-row logprob kernel serves both sides; only the attention switches
    assert matched_parts(torch.device("cuda")) == ExactParts.only("attention")
    unmatch_kernels(other)
    assert exact_parts(other) == ExactParts.none() and not is_batch_invariant(other)
    with pytest.raises(ValueError, match="not the matched kernels"):
        unmatch_kernels(other)


def test_cublas_fprop_is_refused_off_sm90_and_the_exact_gemm_wins():
    from nemo_jetrl.precision.convert import use_cublas_fprop
    from nemo_jetrl.precision.linear import fprop_backend

    model = random_tiny_qwen3(0)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    with pytest.raises(ValueError, match="use_cublas_fprop: needs FP8 linears on a GPU"):
        use_cublas_fprop(model)
    linear = next(m for m in model.modules() if isinstance(m, Fp8Linear))
    assert fprop_backend(linear) == "auto"
    linear.fprop_kernel = FpropKernel.CUBLAS
    assert fprop_backend(linear) == "scaled_mm_padded"
    linear.fprop_kernel = FpropKernel.CUBLAS.with_exact(True)  # the exact mode's GEMM takes precedence
    assert fprop_backend(linear) == "batch_invariant"


def test_one_gemm_choice_per_linear_whatever_order_the_switches_run(monkeypatch):
    from nemo_jetrl.precision import Fp8RolloutLinear, build_rollout_replica, convert, gemm
    from nemo_jetrl.precision.expert_linear import ExpertLinear
    from nemo_jetrl.precision.linear import fprop_backend

    model = random_tiny_qwen3(0)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert not any(hasattr(m, "batch_invariant") or hasattr(m, "fprop_cublas") for m in fp8)  # one field each

    def backends():
        return {fprop_backend(m) for m in fp8}

    enable_batch_invariant(model)
    match_kernels(model, torch.device("cpu"))  # the matched kernels replace the exact mode; no cuBLAS on CPU
    assert backends() == {"auto"} and exact_parts(model) == MATCHED_PARTS
    unmatch_kernels(model)
    # a GPU where cuBLAS runs the blockwise recipe: matched kernels pin cuBLAS, the exact mode's GEMM then wins
    monkeypatch.setattr(gemm, "gemm_backend", lambda device: "scaled_mm")
    monkeypatch.setattr(convert, "gemm_backend", lambda device: "scaled_mm")
    match_kernels(model, torch.device("cpu"))
    assert backends() == {"scaled_mm_padded"}
    enable_batch_invariant(model)
    assert backends() == {"batch_invariant"}
    assert convert.use_cublas_fprop(model) == len(fp8) and backends() == {"batch_invariant"}
    replica = build_rollout_replica(model)  # the rollout copy runs the trainer's choice
    assert {m.fprop_kernel for m in replica.modules() if isinstance(m, Fp8RolloutLinear)} == {
        FpropKernel.BATCH_INVARIANT
    }
    enable_batch_invariant(model, ExactParts.only("attention"))  # the exact GEMM off: back to the library's
    assert backends() == {"auto"}
    # the value refuses what it cannot run: unknown names, old booleans, cuBLAS on a high-precision linear
    with pytest.raises(ValueError, match=r"FpropKernel must be one of \['auto', 'cublas', 'batch_invariant'\]"):
        fp8[0].fprop_kernel = True
    with pytest.raises(ValueError, match="got 'cuBLAS'"):
        FpropKernel("cuBLAS")
    with pytest.raises(ValueError, match="ExpertLinear.fprop_kernel must be one of"):
        ExpertLinear(nn.Parameter(torch.zeros(2, 4, 4))).fprop_kernel = FpropKernel.CUBLAS
    fp8[0].fprop_kernel = "cublas"
    assert fp8[0].fprop_kernel is FpropKernel.CUBLAS


def test_the_switches_compose_into_one_value():
    auto, cublas, exact = FpropKernel.AUTO, FpropKernel.CUBLAS, FpropKernel.BATCH_INVARIANT
    # (from, exact on, exact off, cuBLAS on, cuBLAS off): the exact GEMM wins over cuBLAS in either order
    table = [
        (auto, exact, auto, cublas, auto),
        (cublas, exact, cublas, cublas, auto),
        (exact, exact, auto, exact, exact),
    ]
    for kernel, exact_on, exact_off, cublas_on, cublas_off in table:
        assert kernel.with_exact(True) is exact_on and kernel.with_exact(False) is exact_off
        assert kernel.with_cublas(True) is cublas_on and kernel.with_cublas(False) is cublas_off


def _rollout_and_trainer(preset: str):
    model = random_tiny_qwen3(0)
    recipe = PrecisionRecipe.preset(preset)
    if recipe.any_fp8:
        convert_to_fp8(model, recipe)
    enable_batch_invariant(model)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 9, (6,), generator=gen).tolist()
    prompts = [torch.randint(1, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    engine = NativeGenerationEngine(
        model, max_new_tokens=4, stop_token_ids=[], pad_token_id=0, compute_dtype=BF16,
        kv_cache_dtype=recipe.kv_cache_dtype,
    )  # fmt: skip
    hook = None
    if recipe.kv_fp8:  # scales from the trainer's calibration pass; the trainer fake-quantizes K/V with them
        calib = QKVCalibrator(model.config.num_hidden_layers)
        ids = torch.tensor([p[:3] for p in prompts])
        with torch.no_grad():
            sequence_logprobs(model, ids, torch.ones_like(ids), compute_dtype=BF16, attn_hook=calib)
        scales = calib.scales()
        engine.update_weights(kv_scales=scales.kv)
        hook = make_attn_hook(None, scales)
    out = engine.generate(prompts, generator=torch.Generator().manual_seed(1))
    return model, out, hook


@pytest.mark.parametrize("preset", ["bf16", "jetrl", "jetrl_kv"])
def test_trainer_forward_equals_the_rollout_at_every_micro_batch(preset):
    model, out, hook = _rollout_and_trainer(preset)
    mask = out.response_mask.bool()
    assert int(mask.sum()) == 6 * 4
    for mbs in (1, 4, 6):  # rows scored alone, in uneven micro-batches, all at once
        with torch.no_grad():
            logp = torch.cat(
                [
                    sequence_logprobs(
                        model, out.input_ids[i : i + mbs], out.attention_mask[i : i + mbs], compute_dtype=BF16,
                        attn_hook=hook,
                    )
                    for i in range(0, len(out), mbs)
                ]
            )  # fmt: skip
        assert torch.equal(logp[mask], out.generation_logprobs[mask]), (preset, mbs)
