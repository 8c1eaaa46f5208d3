"""The grouped FP8 expert GEMM (precision/kernels/triton_grouped_gemm.py): its device-side tile map, and in Triton's
interpreter (a child process) each expert's rows bit for bit the batch-invariant FP8 kernel's for that expert alone,
at every tile configuration, within FP32 rounding of the float64 twin, and the grouped DGrad over the transposed tiles
the per-expert DGrad (the GPU run: tests/gpu/test_moe_gpu.py)."""

import textwrap

import pytest
import torch

from nemo_jetrl.precision.kernels.triton_grouped_gemm import tile_map


def test_tile_map_gives_each_expert_its_row_tiles_and_leaves_the_rest_empty():
    slots = tile_map(torch.tensor([3, 0, 70, 1, 5]), 64, 7)  # 5 experts, 79 rows, tiles of 64
    experts, first, end = slots.tolist()
    used = [(e, f, n) for e, f, n in zip(experts, first, end) if f < n]
    assert used == [(0, 0, 3), (2, 3, 73), (2, 67, 73), (3, 73, 74), (4, 74, 79)]  # (expert, first row, its end); 1: none
    assert all(f >= n for f, n in zip(first[5:], end[5:]))  # the unused slots do nothing


CHILD = textwrap.dedent(
    """
    import json, torch
    from nemo_jetrl.precision import act_quant
    from nemo_jetrl.precision.batch_invariant import fp8_mm_ref
    from nemo_jetrl.precision.kernels import triton_batch_invariant as T
    from nemo_jetrl.precision.kernels.triton_grouped_gemm import grouped_fp8_gemm
    from nemo_jetrl.precision.recipe import PrecisionRecipe
    from nemo_jetrl.precision.recipes import BLOCKWISE

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    torch.manual_seed(0)
    counts = torch.tensor([3, 0, 70, 1, 5])
    x, w = torch.randn(79, 1152), torch.randn(5, 256, 1152) * 0.05  # 9 K blocks: two chunks
    xq, xs = act_quant(x)
    wq, ws, _ = BLOCKWISE.expert_weight_quant(w, PrecisionRecipe.preset("jetrl"))
    outs = [grouped_fp8_gemm(xq, xs, wq, ws, counts, torch.float32, config=c) for c in ((64, 64, 4, 3), (128, 128, 8, 3))]
    r, lo, equal, errs = {}, 0, [], []
    for e, c in enumerate(counts.tolist()):
        if c:
            rows = slice(lo, lo + c)
            alone = T.fp8_gemm(xq[rows], xs[rows], wq[e], ws[e], torch.float32, config=(64, 64, 4, 3), split=False)
            equal.append(torch.equal(outs[0][rows], alone))
            errs.append(rel(outs[0][rows], fp8_mm_ref(xq[rows], xs[rows], wq[e], ws[e], torch.float32)))
        lo += c
    r["per_expert_equal"], r["rel_twin"] = all(equal), max(errs)
    r["configs_equal"] = torch.equal(outs[0], outs[1])
    one = grouped_fp8_gemm(xq[3:73], xs[3:73], wq, ws, torch.tensor([0, 0, 70, 0, 0]), torch.float32)
    r["expert_alone_equal"] = torch.equal(one, outs[0][3:73])
    # DGrad: dY [M, N] (1x128 along N) @ each expert's transposed tiles = the per-expert emulated DGrad
    from nemo_jetrl.precision.expert_linear import quantized_experts
    from nemo_jetrl.precision.kernels.triton_grouped_gemm import transposed_experts
    from nemo_jetrl.precision.quantized import QuantizedWeight
    recipe = PrecisionRecipe.preset("jetrl")
    dy = torch.randn(79, 256)
    dyq, dys = act_quant(dy)
    dx = grouped_fp8_gemm(dyq, dys, *transposed_experts(wq, ws), counts, torch.float32)
    experts, lo, errs = quantized_experts(QuantizedWeight(wq, ws, 0)), 0, []
    for e, c in enumerate(counts.tolist()):
        if c:
            wt = BLOCKWISE.dgrad_weight(experts[e], w[e], recipe)
            errs.append(rel(dx[lo : lo + c], BLOCKWISE.dgrad(dyq[lo : lo + c], dys[lo : lo + c], wt, torch.float32, recipe)))
        lo += c
    r["dgrad_rel"] = max(errs)
    print(json.dumps(r))
    """
)


def test_grouped_kernel_in_the_interpreter(run_interpreted):
    pytest.importorskip("triton")
    r = run_interpreted(CHILD)
    assert r["per_expert_equal"] and r["expert_alone_equal"]  # the other experts' rows change no bit
    assert r["configs_equal"]
    assert r["rel_twin"] < 1e-6
    assert r["dgrad_rel"] < 1e-6  # the grouped DGrad over the transposed tiles: the per-expert DGrad


def test_per_expert_tensorwise_scales_are_copied_onto_16_byte_boundaries_once():
    from nemo_jetrl.precision.expert_linear import quantized_experts
    from nemo_jetrl.precision.quantized import QuantizedWeight

    data = torch.zeros(4, 128, 128).to(torch.float8_e4m3fn)
    scale = torch.arange(1.0, 5.0).reshape(4, 1, 1)  # [E, 1, 1]: expert e's scale 4 e bytes into the storage
    qweight = QuantizedWeight(data, scale, 0)
    experts = quantized_experts(qweight)
    assert all(e.scale.data_ptr() % 16 == 0 for e in experts)  # cuBLASLt takes these scale pointers
    assert [e.scale.item() for e in experts] == [1.0, 2.0, 3.0, 4.0]
    assert experts[0].scale.data_ptr() == scale.data_ptr()  # an aligned view stays a view
    assert quantized_experts(qweight) is experts  # made once per FP8 weight, not per GEMM
