"""The trainer's scoring of FP8-KV rollouts: K/V fake-quant (close), deterministic replay (bitwise), engine options."""

import pytest
import torch

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.kv import QKVCalibrator, make_attn_hook

STOP = 31


def batch_prompts(n: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 8, (n,), generator=gen)
    return [torch.randint(1, 32, (int(k),), generator=gen).tolist() for k in lengths]


def calibrated_fp8_engine(model, prompts, compute_dtype=None, **kw):
    """A bf16-cache rollout observed by the trainer's calibrator, then an FP8-KV engine with those scales."""
    eng = NativeGenerationEngine(
        model, max_new_tokens=10, stop_token_ids=[STOP], pad_token_id=0, compute_dtype=compute_dtype, **kw
    )
    out = eng.generate(prompts, generator=torch.Generator().manual_seed(0))
    calib = QKVCalibrator(model.config.num_hidden_layers)
    with torch.no_grad():
        sequence_logprobs(model, out.input_ids, out.attention_mask, compute_dtype=compute_dtype, attn_hook=calib)
    scales = calib.scales()
    fp8 = eng.replace(kv_cache_dtype="fp8")
    fp8.update_weights(kv_scales=scales.kv)
    return fp8, scales


def test_trainer_fake_quant_scores_the_fp8_kv_rollout(fresh_model):
    """Unified KV precision: the trainer's forward with K/V fake-quantized (same scales) == the rollout's logprobs
    up to fp32 noise between decode-shaped and full-sequence GEMMs; without fake-quant the FP8 error shows."""
    prompts = batch_prompts(16)
    eng, scales = calibrated_fp8_engine(fresh_model, prompts)
    out = eng.generate(prompts, generator=torch.Generator().manual_seed(2))
    resp = out.response_mask.bool()
    with torch.no_grad():
        fq = sequence_logprobs(fresh_model, out.input_ids, out.attention_mask, attn_hook=make_attn_hook(None, scales))
        plain = sequence_logprobs(fresh_model, out.input_ids, out.attention_mask)
    unified = (fq - out.generation_logprobs)[resp].abs()
    assert unified.mean().item() <= 1e-4 and unified.max().item() <= 2e-3  # measured max 7.6e-6
    assert (plain - out.generation_logprobs)[resp].abs().mean().item() > 1e-2  # measured 0.097


def test_deterministic_score_replays_the_rollout_bitwise(fresh_model):
    """`score` = the rollout's own computation with its tokens forced: gen_kl_error == 0 for FP8 linears + FP8 KV +
    bf16 autocast on a 6-row batch, where the trainer's full-sequence forward differs in the last bits."""
    convert_to_fp8(fresh_model, PrecisionRecipe.preset("jetrl"))
    prompts = batch_prompts(6)
    eng, scales = calibrated_fp8_engine(fresh_model, prompts, compute_dtype=torch.bfloat16, temperature=0.8)
    out = eng.generate(prompts, generator=torch.Generator().manual_seed(6))
    assert out.finished.any() and not out.finished.all()  # rows of different lengths
    replay = eng.score(out.input_ids, out.attention_mask, out.prompt_length)
    assert torch.equal(replay, out.generation_logprobs)
    with torch.no_grad():
        full = sequence_logprobs(
            fresh_model,
            out.input_ids,
            out.attention_mask,
            temperature=0.8,
            compute_dtype=torch.bfloat16,
            attn_hook=make_attn_hook(None, scales),
        )
    assert not torch.equal(full, out.generation_logprobs)  # measured: 28% of tokens equal, max diff 0.3


def test_sync_every_keeps_the_layout(tiny_model):
    prompts = batch_prompts(8)
    kw = dict(max_new_tokens=12, stop_token_ids=[STOP], pad_token_id=0, static_decode=True)
    a = NativeGenerationEngine(tiny_model, sync_every=1, **kw).generate(prompts, greedy=True)
    b = NativeGenerationEngine(tiny_model, sync_every=5, **kw).generate(prompts, greedy=True)
    for name in ("input_ids", "attention_mask", "response_mask", "generation_logprobs", "response_lengths"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.input_ids.shape[1] == a.prompt_length + int(a.response_lengths.max())


def test_engine_options_and_score_validation(tiny_model):
    kw = dict(max_new_tokens=4, stop_token_ids=[STOP], pad_token_id=0)
    eng = NativeGenerationEngine(tiny_model, cuda_graphs=True, **kw)
    assert not eng.cuda_graphs and not eng.fused_decode and eng.sync_every == 1  # CPU: plain exact path
    with pytest.raises(ValueError, match="sync_every"):
        NativeGenerationEngine(tiny_model, sync_every=0, **kw)
    with pytest.raises(ValueError, match="fused_decode"):
        NativeGenerationEngine(tiny_model, fused_decode=True, **kw)
    eng.update_weights(kv_scales=(torch.ones(2), torch.ones(2)))
    fp8 = eng.replace(kv_cache_dtype="fp8", max_new_tokens=2)
    assert fp8.max_new_tokens == 2 and fp8.kv_scales is eng.kv_scales and fp8.model is tiny_model
    ids = torch.ones(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="both be"):
        eng.score(ids, ids[:, :5], 3)
    with pytest.raises(ValueError, match="prompt_length"):
        eng.score(ids, ids, 1)  # 5 response columns > max_new_tokens=4
    with pytest.raises(ValueError, match="prompt_length"):
        eng.score(ids, ids, 6)
