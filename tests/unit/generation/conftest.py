"""Tiny random-init Qwen3 (the brief's shape) and a batch of prompts of different lengths."""

import pytest
import torch
from transformers import Qwen3ForCausalLM

from nemo_jetrl.models.tiny import random_tiny_qwen3

VOCAB = 32
PAD = 0


def build_tiny_qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    return random_tiny_qwen3(seed)


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
