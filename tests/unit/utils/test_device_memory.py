"""release_cached_memory: empty_cache on CUDA devices only; the native engine's finish_generation and the trainer's
train() call it (what the GRPO step's device footprint relies on between its phases)."""

import torch

from nemo_jetrl.utils import device_memory


def test_only_a_cuda_device_empties_the_cache(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    assert device_memory.release_cached_memory("cpu") is False and calls == []
    assert device_memory.release_cached_memory(torch.device("cuda", 0)) is True and calls == [1]
