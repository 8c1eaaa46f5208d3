"""The glue RMSNorm kernel compiled for Hopper (sm_90) without a GPU: with its FP8 output (the rollout's
`fused_ops.add_rms_norm_fp8`) it sums the squares in the layout of the plain kernel the trainer runs, at the shipped
models' widths. With that, and squares exact in FP32 (16-bit activations, `decoder.exact_squares`), the two give the
same sum of squares, so the exact mode and matched kernels keep the fused norm + FP8 cast over BF16 activations
(`tests/gpu/test_matched_packing_gpu.py`'s BF16-master case checks the bits on the hardware)."""

import re

import pytest
import torch

triton = pytest.importorskip("triton")

from .test_batch_invariant_compiled import compile_sm90  # noqa: E402

WIDTHS = (1024, 2048, 4096, 5120)  # the small GPU-test models, Qwen3-1.7B, 8B, 32B


def _compile(dtype: str, quant: bool, width: int) -> str:
    """`_add_rms_norm_kernel`'s TTGIR for sm_90 as `fused_ops._add_rms_norm` launches it (with a residual add)."""
    import triton.language as tl

    from nemo_jetrl.models import fused_ops

    kernel = fused_ops._add_rms_norm_kernel
    act = f"*{dtype}"
    signature = {"x_ptr": act, "d_ptr": act, "w_ptr": "*bf16", "res_ptr": act, "out_ptr": act,
                 "q_ptr": "*fp8e4nv" if quant else act, "s_ptr": "*fp32" if quant else act, "N": "i32",
                 "stride_x": "i32", "stride_d": "i32", "stride_sg": "i32", "eps": "fp32"}  # fmt: skip
    dt = {"bf16": tl.bfloat16, "fp32": tl.float32}[dtype]
    block = triton.next_power_of_2(width)
    constants = dict(HAS_DELTA=True, RES=dt, OUT=dt, BLOCK=block, QUANT=quant, QB=128, POW2=False, HW=True)
    return compile_sm90(kernel, signature, constants, num_warps=min(16, max(1, block // 256)))  # as launched


def squares_layout(ir: str) -> str:
    """The layout definition of the tensor whose sum the norm takes: the first `x * x` product of the module."""
    square = re.search(r"^\s*(%\S+) = arith\.mulf (%\S+), \2 : tensor<\d+xf32, (#\w+)>", ir, flags=re.M)
    assert square, "no x * x product in the kernel"
    assert re.search(rf'"tt\.reduce"\({re.escape(square.group(1))}\)', ir), "the product is not what is summed"
    return re.search(rf"^{square.group(3)} = (.*)$", ir, flags=re.M).group(1)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_fp8_output_norm_sums_its_squares_in_the_plain_kernels_layout(width):
    assert squares_layout(_compile("bf16", True, width)) == squares_layout(_compile("bf16", False, width))


def test_the_layout_check_tells_layouts_apart():
    """Another layout of the summed product is told apart (the check can fail)."""
    ir = _compile("bf16", False, 2048)
    one = squares_layout(ir)
    other = re.sub(r"warpsPerCTA = \[\d+\]", "warpsPerCTA = [4]", one)
    name = re.search(r"arith\.mulf (%\S+), \1 : tensor<\d+xf32, (#\w+)>", ir).group(2)
    assert squares_layout(ir.replace(f"{name} = {one}", f"{name} = {other}")) != one


def test_only_16_bit_activations_have_exact_squares():
    from nemo_jetrl.models.decoder import exact_squares

    assert exact_squares(torch.bfloat16) and exact_squares(torch.float16)
    assert not exact_squares(torch.float32)
    # the property itself: every bf16 value's square is exact in fp32, not every fp32 value's
    x = torch.randn(4096, dtype=torch.float64).to(torch.bfloat16).double()
    assert torch.equal((x * x).float().double(), x * x)
    y = torch.randn(4096, dtype=torch.float32).double()
    assert not torch.equal((y * y).float().double(), y * y)
