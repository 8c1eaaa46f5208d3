"""Tiny random-init Qwen3 (the brief's shape) and a batch of prompts of different lengths."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB = 32
PAD = 0


def build_tiny_qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    """hidden 256, 2 layers, 2 heads x 128, 1 KV head, vocab 32, tied embeddings. initializer_range 0.2 (HF default
    0.02) so greedy outputs vary instead of repeating one token, which makes token-for-token checks meaningful."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        vocab_size=VOCAB,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    return Qwen3ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny_model() -> Qwen3ForCausalLM:
    return build_tiny_qwen3()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in (3, 7, 1, 5, 6, 2)]


@pytest.fixture
def fresh_model() -> Qwen3ForCausalLM:
    """A model the test may modify."""
    return build_tiny_qwen3()
