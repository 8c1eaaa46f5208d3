"""The tiny-arith Qwen3 model: shapes the FP8 recipe can block, tied embeddings, seeded init."""

import pytest
import torch
from transformers import Qwen3ForCausalLM

from nemo_jetrl.models.tiny import build_tiny_model, tiny_arith_config
from nemo_jetrl.models.tokenizer import build_arith_tokenizer


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(0)


def test_config_matches_tokenizer():
    cfg, tok = tiny_arith_config(), build_arith_tokenizer()
    assert cfg.model_type == "qwen3" and cfg.architectures == ["Qwen3ForCausalLM"]
    assert cfg.vocab_size == len(tok) == 32
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (256, 768, 4)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (2, 1, 128)
    assert cfg.tie_word_embeddings and cfg._attn_implementation == "sdpa"


def test_every_transformer_linear_is_128_blockable(model):
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert len(linears) == 4 * 7 + 1  # q k v o gate up down per layer + lm_head
    for name, lin in linears.items():
        if name == "lm_head":
            continue
        assert lin.in_features % 128 == 0 and lin.out_features % 128 == 0, name
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (128, 256)


def test_model_is_fp32_tied_and_sized(model):
    assert isinstance(model, Qwen3ForCausalLM)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 3_157_248


def test_forward_shape(model):
    ids = torch.tensor([[1, 4, 11, 14, 7, 9, 15]])  # ids: [1, 7]
    logits = model(input_ids=ids).logits  # logits: [1, 7, 32]
    assert logits.shape == (1, 7, 32) and torch.isfinite(logits).all()


def test_seeded_init_is_reproducible_and_leaves_global_rng_alone(model):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    same = build_tiny_model(0)
    assert torch.equal(torch.rand(3), expected)
    for (name, a), b in zip(model.state_dict().items(), same.state_dict().values()):
        assert torch.equal(a, b), name
    other = build_tiny_model(1)
    assert not torch.equal(other.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight)
    with pytest.raises(ValueError, match="seed"):
        build_tiny_model("0")
