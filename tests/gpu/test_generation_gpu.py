"""Native engine on CUDA: fp32 greedy == CPU greedy, logprobs match the trainer, static decode and FP8 KV run."""

import copy

import pytest
import torch
from transformers import Qwen3ForCausalLM

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3

pytestmark = pytest.mark.gpu

PAD, VOCAB, MAX_NEW = 0, 32, 24


def tiny_qwen3() -> Qwen3ForCausalLM:
    return random_tiny_qwen3(0)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in (3, 7, 1, 5, 6, 2)]


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """No TF32: fp32 on the GPU must be fp32 to compare with the CPU token for token."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("static", [False, True], ids=["prefix", "static"])
def test_cuda_greedy_equals_cpu_greedy_fp32(static):
    cpu_model = tiny_qwen3()
    gpu_model = copy.deepcopy(cpu_model).cuda()
    kw = dict(max_new_tokens=MAX_NEW, stop_token_ids=[31], pad_token_id=PAD)
    cpu = NativeGenerationEngine(cpu_model, **kw).generate(prompts(), greedy=True)
    gpu = NativeGenerationEngine(gpu_model, static_decode=static, **kw).generate(prompts(), greedy=True)
    assert gpu.input_ids.is_cuda
    assert torch.equal(gpu.input_ids.cpu(), cpu.input_ids)
    assert torch.equal(gpu.finished.cpu(), cpu.finished)
    assert (gpu.generation_logprobs.cpu() - cpu.generation_logprobs).abs().max().item() <= 1e-4


def test_cuda_sampled_logprobs_match_trainer_bf16():
    model = tiny_qwen3().cuda()
    eng = NativeGenerationEngine(
        model,
        max_new_tokens=MAX_NEW,
        temperature=0.8,
        stop_token_ids=[31],
        pad_token_id=PAD,
        compute_dtype=torch.bfloat16,
    )
    out = eng.generate(prompts() * 4, generator=torch.Generator(device="cuda").manual_seed(0))
    trainer = sequence_logprobs(model, out.input_ids, out.attention_mask, temperature=0.8, compute_dtype=torch.bfloat16)
    diff = (trainer * out.response_mask - out.generation_logprobs).abs()
    assert diff.max().item() <= 0.15
    assert diff[out.response_mask.bool()].mean().item() <= 0.02


def test_cuda_fp8_kv_cache_generates():
    model = tiny_qwen3().cuda()
    eng = NativeGenerationEngine(
        model,
        max_new_tokens=MAX_NEW,
        stop_token_ids=[31],
        pad_token_id=PAD,
        kv_cache_dtype="fp8",
        compute_dtype=torch.bfloat16,
    )
    eng.update_weights(kv_scales=(torch.full((2,), 0.05), torch.full((2,), 0.05)))
    out = eng.generate(prompts(), generator=torch.Generator(device="cuda").manual_seed(0))
    assert torch.isfinite(out.generation_logprobs).all()
    assert (out.generation_logprobs[out.response_mask.bool()] < 0).all()
