"""NativeGenerationEngine on CPU: HF-exact greedy, layout, logprobs vs the trainer's sequence_logprobs, FP8 KV."""

import copy

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.scoring import sequence_logprobs

PAD = 0
MAX_NEW = 24
FP32_LOGPROB_TOL = 1e-4  # engine vs sequence_logprobs, fp32 (measured max 1.1e-5)
# bf16 (compute_dtype=bfloat16 over fp32 params): different GEMM/SDPA shapes in prefill+decode vs one full forward.
# Measured over 3 seeds x 24 sequences: max 0.081, mean 0.0091 (token_mult_prob_error 1.009).
BF16_LOGPROB_MAX, BF16_LOGPROB_MEAN = 0.15, 0.02


def engine(model, **kw) -> NativeGenerationEngine:
    kw.setdefault("max_new_tokens", MAX_NEW)
    kw.setdefault("stop_token_ids", [])
    return NativeGenerationEngine(model, pad_token_id=PAD, **kw)


def hf_greedy(model, prompts, stop_ids, max_new=MAX_NEW) -> torch.Tensor:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new,
        pad_token_id=PAD,
        eos_token_id=list(stop_ids) or None,
    )


def check_layout(out: GenerationOutput, prompts, stop_ids, max_new=MAX_NEW) -> None:
    """The shared layout of docs/architecture.md, row by row."""
    P = out.prompt_length
    assert P == max(len(p) for p in prompts)
    assert out.input_ids.shape == out.attention_mask.shape == out.response_mask.shape == out.generation_logprobs.shape
    assert out.generation_logprobs.dtype == torch.float32
    for row, prompt in enumerate(prompts):
        n = int(out.response_lengths[row])
        pad_left = P - len(prompt)
        assert out.input_ids[row, pad_left:P].tolist() == prompt
        assert out.attention_mask[row, :P].tolist() == [0] * pad_left + [1] * len(prompt)
        assert out.response_mask[row].tolist() == [0] * P + [1] * n + [0] * (out.input_ids.shape[1] - P - n)
        assert torch.equal(out.attention_mask[row, P:], out.response_mask[row, P:])
        assert (out.input_ids[row, P + n :] == PAD).all()
        response = out.input_ids[row, P : P + n].tolist()
        stops = [i for i, t in enumerate(response) if t in stop_ids]
        if out.finished[row]:
            assert stops == [n - 1], "a finished row ends at its first stop token"
        else:
            assert stops == [] and n == max_new
    lp = out.generation_logprobs
    assert torch.equal(lp[out.response_mask == 0], torch.zeros_like(lp[out.response_mask == 0]))
    assert torch.isfinite(lp).all() and (lp[out.response_mask == 1] < 0).all()


def test_is_a_generation_interface(tiny_model, monkeypatch):
    released = []  # finish_generation gives the rollout's cached blocks back (CUDA: empty_cache)
    monkeypatch.setattr("nemo_jetrl.generation.native.engine.release_cached_memory", released.append)
    eng = engine(tiny_model)
    assert isinstance(eng, GenerationInterface)
    assert eng.prepare_for_generation() and released == []
    assert eng.finish_generation() and released == [eng.device]
    assert eng.model is tiny_model  # weights by reference


def test_greedy_matches_hf_fp32_with_stop_tokens(tiny_model, prompts):
    free = engine(tiny_model).generate(prompts, greedy=True)
    P = free.prompt_length
    assert torch.equal(free.input_ids, hf_greedy(tiny_model, prompts, []))
    assert not free.finished.any() and free.input_ids.shape[1] == P + MAX_NEW
    # a stop token that some rows emit mid-way and others never: mixed finished / truncated rows
    rows_with = {t: {r for r in range(len(prompts)) if t in free.input_ids[r, P + 1 :].tolist()} for t in range(1, 32)}
    stop = next(t for t, rows in rows_with.items() if 0 < len(rows) < len(prompts))
    out = engine(tiny_model, stop_token_ids=[stop]).generate(prompts, greedy=True)
    assert torch.equal(out.input_ids, hf_greedy(tiny_model, prompts, [stop]))
    assert out.finished.any() and not out.finished.all()
    check_layout(out, prompts, [stop])
    # every row stops within 3 tokens: decoding ends early and the output is narrower
    early = sorted({int(t) for t in free.input_ids[:, P + 2]})
    out = engine(tiny_model, stop_token_ids=early).generate(prompts, greedy=True)
    assert out.finished.all() and out.input_ids.shape[1] <= P + 3
    assert torch.equal(out.input_ids, hf_greedy(tiny_model, prompts, early))
    check_layout(out, prompts, early)


def test_greedy_matches_hf_bf16(tiny_model, prompts):
    # compute_dtype=bf16 over fp32 params == HF generate under the same CPU autocast, token for token
    out = engine(tiny_model, compute_dtype=torch.bfloat16).generate(prompts, greedy=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.MATH):  # our CPU attention kernel
        ref = hf_greedy(tiny_model, prompts, [])
    assert torch.equal(out.input_ids, ref)
    assert not torch.equal(out.input_ids, engine(tiny_model).generate(prompts, greedy=True).input_ids)  # bf16 differs
    # a model cast to bf16 == HF on that bf16 model
    bf16_model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    out = engine(bf16_model).generate(prompts, greedy=True)
    with sdpa_kernel(SDPBackend.MATH):
        assert torch.equal(out.input_ids, hf_greedy(bf16_model, prompts, []))


@pytest.mark.parametrize("static", [False, True], ids=["prefix", "static"])
def test_logprobs_match_trainer_fp32(tiny_model, prompts, static):
    eng = engine(tiny_model, temperature=0.8, top_p=0.9, stop_token_ids=[31], static_decode=static)
    out = eng.generate(prompts, generator=torch.Generator().manual_seed(0))
    check_layout(out, prompts, [31])
    trainer = sequence_logprobs(tiny_model, out.input_ids, out.attention_mask, temperature=0.8)
    diff = (trainer * out.response_mask - out.generation_logprobs).abs().max().item()
    assert diff <= FP32_LOGPROB_TOL, diff


def test_logprobs_match_trainer_bf16(tiny_model, prompts):
    eng = engine(tiny_model, temperature=0.8, stop_token_ids=[31], compute_dtype=torch.bfloat16)
    out = eng.generate(prompts * 4, generator=torch.Generator().manual_seed(0))
    trainer = sequence_logprobs(
        tiny_model, out.input_ids, out.attention_mask, temperature=0.8, compute_dtype=torch.bfloat16
    )
    diff = (trainer * out.response_mask - out.generation_logprobs).abs()
    assert diff.max().item() <= BF16_LOGPROB_MAX
    assert diff[out.response_mask.bool()].mean().item() <= BF16_LOGPROB_MEAN


def test_static_decode_equals_prefix_decode(tiny_model, prompts):
    a = engine(tiny_model, stop_token_ids=[31]).generate(prompts, generator=torch.Generator().manual_seed(3))
    b = engine(tiny_model, stop_token_ids=[31], static_decode=True).generate(
        prompts, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(a.input_ids, b.input_ids)
    assert (a.generation_logprobs - b.generation_logprobs).abs().max().item() <= 1e-5


def test_sampling_is_seeded(tiny_model, prompts):
    eng = engine(tiny_model, temperature=1.0, top_k=10)
    a = eng.generate(prompts, generator=torch.Generator().manual_seed(5))
    b = eng.generate(prompts, generator=torch.Generator().manual_seed(5))
    c = eng.generate(prompts, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.generation_logprobs, b.generation_logprobs)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_outputs_are_autograd_safe(fresh_model, prompts):
    out = engine(fresh_model).generate(prompts)
    assert not out.input_ids.is_inference() and not out.generation_logprobs.requires_grad
    logp = sequence_logprobs(fresh_model, out.input_ids, out.attention_mask)
    (logp * out.response_mask).sum().backward()  # the trainer's autograd on the same parameters still works
    assert fresh_model.lm_head.weight.grad is not None


def test_engine_sees_weight_updates_by_reference(fresh_model, prompts):
    eng = engine(fresh_model)
    before = eng.generate(prompts, greedy=True)
    with torch.no_grad():  # an "optimizer step" on the trainer's parameters
        for p in fresh_model.parameters():
            p.mul_(1.5)
    after = eng.generate(prompts, greedy=True)
    assert not torch.equal(before.input_ids, after.input_ids)
    assert torch.equal(after.input_ids, hf_greedy(fresh_model, prompts, []))


def test_fp8_kv_cache_matches_trainer_with_fake_quant_hook(tiny_model, prompts):
    """Unified KV precision: the rollout's e4m3 cache == the trainer's attention with K/V fake-quantized (hook)."""
    out = engine(tiny_model).generate(prompts, generator=torch.Generator().manual_seed(1))
    amax = {"k": torch.zeros(2), "v": torch.zeros(2)}

    def calibrate(layer, q, k, v):
        amax["k"][layer] = torch.maximum(amax["k"][layer], k.abs().max())
        amax["v"][layer] = torch.maximum(amax["v"][layer], v.abs().max())
        return q, k, v

    with torch.no_grad():
        sequence_logprobs(tiny_model, out.input_ids, out.attention_mask, attn_hook=calibrate)
    k_scales, v_scales = amax["k"] * 1.05 / 448, amax["v"] * 1.05 / 448

    def fake_quant(x, scale):
        return (torch.clamp(x / scale, -448, 448).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)

    def kv_fake_quant(layer, q, k, v):
        return q, fake_quant(k, k_scales[layer]), fake_quant(v, v_scales[layer])

    eng = engine(tiny_model, kv_cache_dtype="fp8", stop_token_ids=[31])
    with pytest.raises(ValueError, match="kv_scales"):
        eng.generate(prompts)
    eng.update_weights(kv_scales=(k_scales, v_scales))
    fp8 = eng.generate(prompts, generator=torch.Generator().manual_seed(2))
    check_layout(fp8, prompts, [31])
    with torch.no_grad():
        fq = sequence_logprobs(tiny_model, fp8.input_ids, fp8.attention_mask, attn_hook=kv_fake_quant)
        plain = sequence_logprobs(tiny_model, fp8.input_ids, fp8.attention_mask)
    resp = fp8.response_mask.bool()
    unified = (fq - fp8.generation_logprobs).abs()[resp]
    # fp32 noise, except that a K/V element which differs by an ulp between the full forward and prefill/decode
    # GEMMs can round to the neighbouring e4m3 code: measured max 5e-5 / mean 2e-6 (2 cores),
    # max 4.7e-4 / mean 2.6e-5 (16 cores).
    assert unified.mean().item() <= 1e-4 and unified.max().item() <= 2e-3
    mismatch = (plain - fp8.generation_logprobs).abs()[resp]
    assert mismatch.mean().item() > 1e-2  # the cache really is FP8 (measured mean 0.1 without the hook)


@pytest.mark.parametrize("recipe", ["jetrl", "rowwise", "tensorwise"])
def test_fp8_model_generates_in_rollout_mode(fresh_model, prompts, recipe):
    """On an FP8-converted model the engine runs inside precision.rollout_mode and restores the trainer's mode;
    its logprobs are the trainer's forward's, in each recipe (the same FP8 weight bits and scales, by reference)."""
    from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8, rollout_mode

    convert_to_fp8(fresh_model, PrecisionRecipe.preset(recipe))
    weight_bits = fresh_model.model.layers[0].self_attn.q_proj.quantized_weight()
    q_proj = fresh_model.model.layers[0].self_attn.q_proj
    modes = []

    def record_mode():
        def hook(layer, q, k, v):
            modes.append(q_proj.mode)
            return q, k, v

        return hook

    eng = engine(fresh_model, stop_token_ids=[31], attn_hook_factory=record_mode)
    out = eng.generate(prompts, generator=torch.Generator().manual_seed(0))
    assert set(modes) == {"rollout"} and q_proj.mode == "train"
    check_layout(out, prompts, [31])
    with torch.no_grad():
        trainer = sequence_logprobs(fresh_model, out.input_ids, out.attention_mask)
        with rollout_mode(fresh_model):  # the rollout's linears over the trainer's batch shape
            rollout_full = sequence_logprobs(fresh_model, out.input_ids, out.attention_mask)
    assert q_proj.quantized_weight() is weight_bits  # no re-quantization between rollout and trainer
    assert torch.equal(trainer, rollout_full)  # same weight bits and scales, same activation cast
    diff = (trainer - out.generation_logprobs).abs()[out.response_mask.bool()]
    if recipe != "tensorwise":
        # Unified flow: measured mean 5e-4..6e-3 over 4 seeds (FP8 activation rounding flips amplify the 1e-6
        # fp32 noise between decode-shaped and full-sequence GEMMs); rowwise 2e-3 (seed 0). A plain fp32 rollout
        # against this FP8 trainer: 0.21..0.29.
        assert diff.mean().item() <= 2e-2
    else:
        # One activation scale per tensor: a decode step's amax is over its B tokens, the trainer's over all B x S
        # (prompt, pads, outlier positions), so the rollout's activations are not the trainer's bits: measured
        # mean 0.20 (seed 0) -- the gap docs/precision.md names (weights are still shared bit for bit).
        assert 2e-2 < diff.mean().item() <= 0.5


def test_bad_inputs_raise(tiny_model):
    eng = engine(tiny_model)
    with pytest.raises(ValueError, match="empty"):
        eng.generate([])
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        eng.generate([[1], []])
    with pytest.raises(ValueError, match="outside"):
        eng.generate([[1, 32]])
    with pytest.raises(ValueError, match="by reference"):
        eng.update_weights({"lm_head.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine(tiny_model, max_new_tokens=0)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        engine(tiny_model, kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="temperature"):
        engine(tiny_model, temperature=0.0)
    with pytest.raises(ValueError, match="does not move"):
        engine(tiny_model, device="meta")


def test_prompt_plus_response_is_capped_at_max_total_length(tiny_model, prompts):
    """NeMo-RL's max_new_tokens == max_total_sequence_length: each row stops at the total (truncated, not finished);
    a total that never binds changes nothing."""
    total = max(len(p) for p in prompts) + 2
    capped = engine(tiny_model, max_new_tokens=total, max_total_length=total, stop_token_ids=[]).generate(
        prompts, greedy=True
    )
    real = capped.attention_mask.sum(-1)  # [B] prompt + response tokens of each row
    assert real.tolist() == [total] * len(prompts)
    assert capped.response_lengths.tolist() == [total - len(p) for p in prompts]
    assert not capped.finished.any()
    free = engine(tiny_model, max_new_tokens=MAX_NEW, stop_token_ids=[]).generate(prompts, greedy=True)
    loose = engine(tiny_model, max_new_tokens=MAX_NEW, max_total_length=10_000, stop_token_ids=[])
    assert torch.equal(loose.generate(prompts, greedy=True).input_ids, free.input_ids)


@pytest.mark.parametrize(
    "loop",
    [{}, {"static_decode": True}, {"continuous_batching": True, "sync_every": 100}],
    ids=["prefix", "static", "continuous"],
)
def test_decode_steps_send_no_python_value_to_the_device(tiny_model, prompts, monkeypatch, loop):
    """`torch.tensor` / `torch.as_tensor` given a device turn a host value into a device tensor: on a GPU a blocking
    copy, which stalled every decode step until the device drained (the sampler's draw counter did). In each
    rollout loop, sampled, the calls with a device may not grow with the number of decode steps."""
    calls = []

    def spy(real):
        def make(*args, **kwargs):
            if kwargs.get("device") is not None:
                calls.append(real.__name__)
            return real(*args, **kwargs)

        return make

    monkeypatch.setattr(torch, "tensor", spy(torch.tensor))
    monkeypatch.setattr(torch, "as_tensor", spy(torch.as_tensor))
    counts = []
    for steps in (4, 12):
        calls.clear()
        eng = engine(tiny_model, max_new_tokens=steps, temperature=1.0, **loop)
        out = eng.generate(prompts, generator=torch.Generator().manual_seed(3))
        assert int(out.response_lengths.max()) == steps
        counts.append(len(calls))
    assert counts[0] == counts[1], counts
