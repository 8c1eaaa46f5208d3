"""decoder_forward / compute_logits / sequence_logprobs against the HF models' own forward (CPU, fp32 unless said)."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.models import scoring
from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import EAGER, ForwardInputs, ForwardPlan
from nemo_jetrl.models.logits import compute_logits
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3

VOCAB = 32
FP32_TOL = 1e-4  # max |ours - HF| on real-token logits, fp32


def tiny_qwen3() -> Qwen3ForCausalLM:
    return random_tiny_qwen3(0)


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(1)
    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        initializer_range=0.2,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(2)
    cfg = Qwen2Config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        initializer_range=0.2,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # HF inits the qkv biases to zero; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return model


BUILDERS = {"qwen3": tiny_qwen3, "llama": tiny_llama, "qwen2": tiny_qwen2}


def left_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """[3, 9] ids and mask: rows with 3, 0 and 8 left pads (pad id 0)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (3, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :8] = 0
    return ids.masked_fill(mask == 0, 0), mask


def hf_logits(model, ids, mask, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), **kw).logits


def test_position_ids_from_mask_exact():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0], [0, 1, 1, 0, 0]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 3], [0, 0, 1, 1, 1]])
    assert torch.equal(position_ids_from_mask(mask), expected)


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_forward_matches_hf_left_padded(arch):
    model = BUILDERS[arch]()
    ids, mask = left_padded_batch()
    with torch.no_grad():
        hidden = decoder_forward(model, ids, position_ids_from_mask(mask), mask)  # [B, S, H]
        ours = compute_logits(model, hidden)
    assert hidden.shape == (3, 9, model.config.hidden_size)
    assert ours.dtype == torch.float32
    assert torch.isfinite(ours).all(), "left-pad rows must not give NaN"
    real = mask.bool()
    diff = (ours - hf_logits(model, ids, mask))[real].abs().max().item()
    assert diff <= FP32_TOL, f"{arch}: max |ours - HF| = {diff}"


def test_forward_bf16_autocast_matches_hf_autocast():
    model = tiny_qwen3()
    ids, mask = left_padded_batch()
    with torch.no_grad():
        hidden = decoder_forward(
            model, ids, position_ids_from_mask(mask), mask, ForwardPlan(compute_dtype=torch.bfloat16)
        )
        ours = compute_logits(model, hidden, compute_dtype=torch.bfloat16).float()  # bf16 logits, exactly upcast
        with torch.autocast("cpu", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.MATH):  # our CPU attention kernel
            ref = hf_logits(model, ids, mask).float()
    # Same ops in the same order under the same autocast: identical on CPU (measured max diff 0).
    diff = (ours - ref)[mask.bool()].abs().max().item()
    assert diff <= 1e-6, diff
    fp32 = hf_logits(model, ids, mask)
    assert (ours - fp32)[mask.bool()].abs().max().item() > 1e-4, "compute_dtype=bf16 must actually run in bf16"


def test_attn_hook_sees_bhsd_and_changes_output():
    model = tiny_qwen3()
    ids, mask = left_padded_batch()
    pos = position_ids_from_mask(mask)
    seen = []

    def observe(layer_idx, q, k, v):
        seen.append((layer_idx, tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return q, k, v

    with torch.no_grad():
        base = decoder_forward(model, ids, pos, mask)
        observed = decoder_forward(model, ids, pos, mask, ForwardPlan(attn_hook=observe))
        scaled = decoder_forward(model, ids, pos, mask, ForwardPlan(attn_hook=lambda i, q, k, v: (q, k, v * 0.5)))
    assert seen == [
        (0, (3, 2, 9, 128), (3, 1, 9, 128), (3, 1, 9, 128)),
        (1, (3, 2, 9, 128), (3, 1, 9, 128), (3, 1, 9, 128)),
    ]
    assert torch.equal(base, observed)
    assert (scaled - base)[mask.bool()].abs().max().item() > 1e-2


@pytest.mark.parametrize("static", [False, True], ids=["prefix", "static"])
def test_kv_cache_prefill_decode_matches_full_forward(static):
    model = tiny_qwen3()
    ids, mask = left_padded_batch()  # [3, 9]
    prefill = 5
    with torch.no_grad():
        full = compute_logits(model, decoder_forward(model, ids, position_ids_from_mask(mask), mask))
        cache = KVCache.for_model(model, 3, 9, dtype=torch.float32)
        pos = position_ids_from_mask(mask)
        steps = [
            compute_logits(
                model,
                decoder_forward(
                    model, ids[:, :prefill], pos[:, :prefill], mask[:, :prefill], EAGER, ForwardInputs.cached(cache, 0)
                ),
            )
        ]
        for t in range(prefill, 9):
            if static:
                start, key_mask = torch.tensor(t), mask.masked_fill(torch.arange(9) > t, 0)
            else:
                start, key_mask = t, mask[:, : t + 1]
            hidden = decoder_forward(
                model, ids[:, t : t + 1], pos[:, t : t + 1], key_mask, EAGER, ForwardInputs.cached(cache, start)
            )
            steps.append(compute_logits(model, hidden))
    cached = torch.cat(steps, dim=1)  # [3, 9, V]
    diff = (cached - full)[mask.bool()].abs().max().item()
    assert diff <= FP32_TOL, diff


def test_sequence_logprobs_values_and_layout():
    model = tiny_qwen3()
    ids, mask = left_padded_batch()
    temperature = 0.7
    logp = sequence_logprobs(model, ids, mask, temperature=temperature)  # [B, S]
    ref_logits = hf_logits(model, ids, mask) / temperature
    ref = torch.log_softmax(ref_logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, S-1]
    valid = mask[:, 1:].bool() & mask[:, :-1].bool()
    assert logp.shape == ids.shape and logp.dtype == torch.float32
    assert (logp[:, 1:] - ref)[valid].abs().max().item() <= FP32_TOL
    # exact zeros: column 0, pads, and each row's first real token (no real context before it)
    assert torch.equal(logp[:, 0], torch.zeros(3))
    assert torch.equal(logp[0, :4], torch.zeros(4))
    assert torch.equal(logp[2], torch.zeros(9))
    assert (logp[0, 4:] < 0).all() and (logp[1, 1:] < 0).all()


def test_sequence_logprobs_chunked_equals_whole_and_is_differentiable(monkeypatch):
    model = tiny_qwen3()
    ids, mask = left_padded_batch()
    whole = sequence_logprobs(model, ids, mask)
    monkeypatch.setattr(scoring, "LOGPROB_CHUNK_ELEMENTS", 8 * VOCAB)  # one row per chunk
    chunked = sequence_logprobs(model, ids, mask)
    assert (chunked - whole).abs().max().item() <= 1e-5
    chunked.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.lm_head.weight.grad.abs().sum() > 0


def test_bad_inputs_raise_clear_errors():
    model = tiny_qwen3()
    ids, mask = left_padded_batch()
    pos = position_ids_from_mask(mask)
    with pytest.raises(ValueError, match="attention_mask"):
        decoder_forward(model, ids, pos, mask[:, :-1])
    with pytest.raises(ValueError, match="position_ids"):
        decoder_forward(model, ids, pos[:, :-1], mask)
    with pytest.raises(ValueError, match="cache_start"):
        decoder_forward(model, ids, pos, mask, EAGER, ForwardInputs(cache_start=2))
    with pytest.raises(ValueError, match="temperature"):
        sequence_logprobs(model, ids, mask, temperature=0.0)
    with pytest.raises(ValueError, match="Llama/Qwen2/Qwen3"):
        decoder_forward(torch.nn.Linear(4, 4), ids, pos, mask)


def test_sliding_window_config_refused():
    cfg = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
    )
    model = Qwen2ForCausalLM(cfg)
    ids, mask = left_padded_batch()
    with pytest.raises(ValueError, match="full attention"):
        decoder_forward(model, ids, position_ids_from_mask(mask), mask)
