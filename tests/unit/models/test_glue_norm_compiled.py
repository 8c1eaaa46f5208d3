"""The glue RMSNorm kernel compiled for Hopper (sm_90) without a GPU, specialized as a launch specializes it (16-byte
aligned pointers, row widths and strides multiples of 16): with its FP8 output (the rollout's
`fused_ops.add_rms_norm_fp8`) it sums the squares in the register layout of the plain kernel the trainer runs, at
the shipped models' widths and every activation / weight dtype. One layout, one order of the sum, so the exact mode
and matched kernels keep the fused norm + FP8 cast (`tests/gpu/test_matched_packing_gpu.py` checks the bits on the
hardware, FP32 and BF16 master weights)."""

import re

import pytest
import torch

triton = pytest.importorskip("triton")

from .test_batch_invariant_compiled import compile_sm90  # noqa: E402

WIDTHS = (1024, 2048, 4096, 5120)  # the small GPU-test models, Qwen3-1.7B, 8B, 32B
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
INPUTS = [  # (x, residual delta or None, weight): FP32 / BF16 master weights, the first layer's norm without delta
    ("fp32", "bf16", "fp32"), ("fp32", None, "fp32"), ("fp32", "fp32", "fp32"),
    ("bf16", "bf16", "bf16"), ("bf16", None, "bf16"), ("fp32", "bf16", "bf16"),
]  # fmt: skip


def _compile(x: str, delta: str | None, w: str, quant: bool, width: int, store_run: int | None = None) -> str:
    """`_add_rms_norm_kernel`'s TTGIR for sm_90 as `fused_ops._add_rms_norm` launches it; store_run: the e4m3
    store's `Q_RUN` (default: `_norm_store_run` of the inputs, as launched)."""
    import triton.language as tl

    from nemo_jetrl.models import fused_ops

    d = delta or x  # without a delta the kernel's d_ptr is x
    names = {dtype: name for name, dtype in DTYPES.items()}
    res = names[fused_ops._promote(DTYPES[x], DTYPES[d])]  # the launch's residual / output dtypes
    out = names[fused_ops._promote(DTYPES[res], DTYPES[w])]
    signature = {"x_ptr": f"*{x}", "d_ptr": f"*{d}", "w_ptr": f"*{w}", "res_ptr": f"*{res}", "out_ptr": f"*{out}",
                 "q_ptr": "*fp8e4nv" if quant else f"*{out}", "s_ptr": "*fp32" if quant else f"*{out}", "N": "i32",
                 "stride_x": "i32", "stride_d": "i32", "stride_sg": "i32", "eps": "fp32"}  # fmt: skip
    if store_run is None:
        store_run = fused_ops._norm_store_run(*(torch.empty(0, dtype=DTYPES[t]) for t in (x, d, w)))
    block = triton.next_power_of_2(width)
    tl_dtype = {"bf16": tl.bfloat16, "fp32": tl.float32}
    constants = dict(HAS_DELTA=delta is not None, RES=tl_dtype[res], OUT=tl_dtype[out], BLOCK=block, QUANT=quant,
                     QB=128, POW2=False, HW=True, Q_RUN=store_run)  # fmt: skip
    aligned = ("x_ptr", "d_ptr", "w_ptr", "res_ptr", "out_ptr", "q_ptr", "s_ptr", "N", "stride_x", "stride_d")
    kernel = fused_ops._add_rms_norm_kernel
    return compile_sm90(kernel, signature, constants, aligned, num_warps=fused_ops.row_warps(block))  # as launched


def squares_layout(ir: str) -> str:
    """The layout definition of the tensor whose sum the norm takes: the first `x * x` product of the module."""
    square = re.search(r"^\s*(%\S+) = arith\.mulf (%\S+), \2 : tensor<\d+xf32, (#\w+)>", ir, flags=re.M)
    assert square, "no x * x product in the kernel"
    assert re.search(rf'"tt\.reduce"\({re.escape(square.group(1))}\)', ir), "the product is not what is summed"
    return re.search(rf"^{square.group(3)} = (.*)$", ir, flags=re.M).group(1)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("inputs", INPUTS, ids=["-".join(t or "none" for t in i) for i in INPUTS])
def test_the_fp8_output_norm_sums_its_squares_in_the_plain_kernels_layout(inputs, width):
    assert squares_layout(_compile(*inputs, True, width)) == squares_layout(_compile(*inputs, False, width))


def test_a_store_seen_contiguous_would_take_another_layout():
    """The defect `_norm_store_run` prevents, and that the check above finds: with the e4m3 store seen contiguous
    over 16 columns, an FP32 row without a delta (the first layer's norm under FP32 master weights) sums its squares
    in another layout than the plain kernel (on an H200 it gave other bits, tests/gpu/test_fused_rollout_gpu.py)."""
    fused = squares_layout(_compile("fp32", None, "fp32", True, 1024, store_run=16))
    assert fused != squares_layout(_compile("fp32", None, "fp32", False, 1024))


def test_the_layout_check_tells_layouts_apart():
    """Another layout of the summed product is told apart (the check can fail)."""
    ir = _compile("bf16", "bf16", "bf16", False, 2048)
    one = squares_layout(ir)
    other = re.sub(r"warpsPerCTA = \[\d+\]", "warpsPerCTA = [4]", one)
    name = re.search(r"arith\.mulf (%\S+), \1 : tensor<\d+xf32, (#\w+)>", ir).group(2)
    assert squares_layout(ir.replace(f"{name} = {one}", f"{name} = {other}")) != one
