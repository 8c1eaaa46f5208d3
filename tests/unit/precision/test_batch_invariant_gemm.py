"""The exact mode's linears: the float64 twins (CPU) are batch-invariant and close to the plain GEMMs; the Triton
kernels agree with the twins and, across tile configurations and chunk schedules, with each other bitwise (Triton's
interpreter, in a child process; the GPU run is tests/gpu/test_batch_invariant_gpu.py)."""

import textwrap

import pytest
import torch
import torch.nn.functional as F

from nemo_jetrl.precision import act_quant, fp8_blockwise_mm, weight_quant
from nemo_jetrl.precision import batch_invariant as bi


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


def test_fp8_twin_row_alone_equals_row_in_batch_and_is_close_to_the_emulation():
    torch.manual_seed(0)
    xq, xs = act_quant(torch.randn(64, 512) * 3)
    wq, ws = weight_quant(torch.randn(384, 512) * 0.05)
    bias = torch.randn(384)
    batch = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=bias, backend="batch_invariant")
    for row in (0, 5, 63):
        alone = bi.fp8_mm(xq[row : row + 1], xs[row : row + 1], wq, ws, torch.float32, bias)
        assert torch.equal(alone[0], batch[row])
    emulated = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=bias, backend="emulated")
    assert 0 < rel(batch, emulated) < 1e-6  # FP32 vs exact float64 block sums: last-bit differences only


def test_fp8_twin_block_products_are_exact():
    """e4m3 products and 128-term sums fit float64: the twin's result does not depend on the order of K."""
    torch.manual_seed(1)
    xq, xs = act_quant(torch.randn(8, 256))
    wq, ws = weight_quant(torch.randn(128, 256))
    perm = torch.randperm(128)  # shuffle K within the first block (same scales): exact sums are unchanged
    xq2, wq2 = xq.clone(), wq.clone()
    xq2[:, :128], wq2[:, :128] = xq[:, perm], wq[:, perm]
    assert torch.equal(bi.fp8_mm_ref(xq, xs, wq, ws, torch.float32), bi.fp8_mm_ref(xq2, xs, wq2, ws, torch.float32))


def test_batch_invariant_backend_refuses_what_it_does_not_run():
    xq, xs = act_quant(torch.randn(4, 256))
    wq, ws = act_quant(torch.randn(128, 256))  # 1x128 weight groups
    with pytest.raises(ValueError, match="128x128 weight tiles"):
        fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, w_blocks="1x128", backend="batch_invariant")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_twin_is_batch_invariant_close_and_differentiable(dtype):
    torch.manual_seed(2)
    x = torch.randn(40, 96, dtype=dtype, requires_grad=True)
    w = torch.randn(72, 96, dtype=dtype, requires_grad=True)
    b = torch.randn(72, dtype=dtype, requires_grad=True)
    y = bi.linear(x, w, b)
    for row in (0, 17, 39):
        assert torch.equal(bi.linear(x[row : row + 1], w, b)[0], y[row])
    ref = F.linear(x.double(), w.double(), b.double())
    assert y.dtype == dtype and rel(y, ref) < (1e-6 if dtype == torch.float32 else 5e-3)
    y.square().sum().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    F.linear(x, w, b).square().sum().backward()
    for got, t in zip(grads, (x, w, b)):
        assert rel(got, t.grad) < (1e-5 if dtype == torch.float32 else 2e-2)


def test_linear_follows_autocast_like_f_linear():
    x, w = torch.randn(3, 4, 64), torch.randn(32, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, ref = bi.linear(x, w), F.linear(x, w)
    assert y.dtype == ref.dtype == torch.bfloat16 and y.shape == (3, 4, 32)
    assert rel(y, ref) < 1e-2


CHILD = textwrap.dedent(
    """
    import json, torch
    from nemo_jetrl.precision import act_quant, weight_quant
    from nemo_jetrl.precision.batch_invariant import fp8_mm_ref, mm_ref
    from nemo_jetrl.precision.kernels import triton_batch_invariant as T

    def rel(a, b):
        return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())

    torch.manual_seed(0)
    r = {}
    x, w, bias = torch.randn(70, 4352), torch.randn(256, 4352) * 0.05, torch.randn(256)  # 34 K blocks: 3 chunks
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    ref = fp8_mm_ref(xq, xs, wq, ws, torch.float32, bias)
    outs = [
        T.fp8_gemm(xq, xs, wq, ws, torch.float32, bias, config=c, split=s)
        for c in ((64, 64, 4, 4), (128, 128, 8, 3)) for s in (False, True)
    ]
    r["fp8_rel"] = max(rel(o, ref) for o in outs)
    r["fp8_all_equal"] = all(torch.equal(o, outs[0]) for o in outs)
    r["fp8_row_alone_equal"] = torch.equal(T.fp8_gemm(xq[3:4], xs[3:4], wq, ws, torch.float32, bias)[0], outs[0][3])
    x, w, b = torch.randn(70, 200), torch.randn(300, 200), torch.randn(300)
    outs = [T.mm(x, w, b, config=c) for c in ((64, 128, 4, 4), (128, 128, 8, 3))]
    r["mm_rel"] = max(rel(o, mm_ref(x, w, b)) for o in outs)
    r["mm_equal"] = torch.equal(outs[0], outs[1]) and torch.equal(T.mm(x[5:6], w, b)[0], outs[0][5])
    r["mm_row_alone_equal"] = torch.equal(T.mm(x[5:6], w, b)[0], outs[0][5])
    # the interpreter's tl.dot is numpy's matmul on the tiles: whether its BLAS gives a tile's rows the same bits
    # at every tile shape (OpenBLAS's FMA kernels on some CPUs do not)
    import numpy as np
    a, c = np.random.default_rng(0).standard_normal((2, 128, 128), dtype=np.float32)
    r["blas_tile_invariant"] = bool(np.array_equal((a @ c)[:64, :64], a[:64] @ c[:, :64]))
    print(json.dumps(r))
    """
)


def test_triton_kernels_in_the_interpreter(run_interpreted):
    pytest.importorskip("triton")
    r = run_interpreted(CHILD)
    assert r["fp8_row_alone_equal"] and r["mm_row_alone_equal"]
    # equal bits across tile configs need a BLAS whose tile products do not depend on the tile shape (the GPU test,
    # tests/gpu/test_batch_invariant_gpu.py, checks the compiled kernels bitwise everywhere)
    if r["blas_tile_invariant"]:
        assert r["fp8_all_equal"] and r["mm_equal"]
    assert r["fp8_rel"] < 1e-6 and r["mm_rel"] < 1e-6
