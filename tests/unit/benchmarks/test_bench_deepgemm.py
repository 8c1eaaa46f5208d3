"""benchmarks/bench_deepgemm.py off the GPU: the Qwen3-8B GEMM shapes it times, and that each pass's FP8 operands
(the ones scaled_mm and DeepGEMM both take) compute that pass's BF16 product (emulated GEMM, CPU)."""

from __future__ import annotations

import pytest
import torch

from nemo_jetrl.precision.gemm import fp8_blockwise_mm


def _load():
    from benchmarks import bench_deepgemm

    return bench_deepgemm


def test_the_linears_are_qwen3_8b_s_grouped_gemms():
    bench = _load()
    from benchmarks.common import QWEN3_8B

    assert bench.linears(QWEN3_8B) == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096),
                                       "down": (4096, 12288)}  # fmt: skip


@pytest.mark.parametrize("kind,out_shape", [("fprop", (256, 384)), ("dgrad", (256, 128)), ("wgrad", (384, 128))])
def test_each_pass_s_fp8_operands_compute_its_bf16_product(kind, out_shape):
    bench = _load()
    torch.manual_seed(0)
    ops = bench.operands(kind, 256, 384, 128, torch.device("cpu"))  # M=256 tokens, N=384, K=128
    a16, b16 = ops["bf16"]
    want = (a16.float() @ b16.float()).double()  # [out]
    aq, as_, bq, bs = ops["fp8"]
    got = fp8_blockwise_mm(aq, as_, bq, bs, ops["dtype"], w_blocks=ops["blocks"], backend="emulated")
    assert ops["out"] == out_shape and tuple(got.shape) == out_shape
    assert got.dtype == (torch.float32 if kind == "wgrad" else torch.bfloat16)  # WGrad: FP32 into master grads
    got = got.double()
    rel = float((got - want).norm() / want.norm())
    # measured 0.036-0.037 (e4m3 rounding of both operands); a wrong layout is ~1.4, a BF16-rounded product 0.0016
    assert 0.01 < rel < 0.05


def test_without_a_gpu_it_says_so_and_runs_nothing(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert _load().main([]) is None
    assert "needs a CUDA GPU" in capsys.readouterr().err
