"""precision.kv: KV scale formula, QKV calibration on hand-built amaxes, fake-quant (bits and straight-through grad)."""

import numpy as np
import pytest
import torch

from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.precision.kv import (
    KVScales,
    QKVCalibrator,
    kv_dequant,
    kv_fake_quant,
    kv_quant,
    kv_scale_from_amax,
    make_attn_hook,
)
from nemo_jetrl.precision.recipe import KVCalibration

R = torch.tensor(1.0 / 448.0, dtype=torch.float32)  # the recipe's float32 reciprocal


def qkv(amax_q: float, amax_k: float, amax_v: float, shape=(2, 2, 3, 128)):
    """Tensors [B, H, S, D] whose abs-max is exactly the given value (a negative entry carries it)."""
    out = []
    for amax in (amax_q, amax_k, amax_v):
        t = torch.full(shape, amax / 4, dtype=torch.bfloat16)
        t[0, 0, 0, 0] = -amax
        out.append(t)
    return out


def test_kv_scale_from_amax_exact_values():
    amax = torch.tensor([448.0, 1.0, 0.0, 3.5])
    got = kv_scale_from_amax(amax, 1.05)
    want = (amax * torch.tensor(1.05, dtype=torch.float32)).clamp_min(1e-10) * R
    assert torch.equal(got, want)
    assert got[2].item() > 0 and torch.isfinite(got).all()  # an all-zero layer still gets a finite scale
    assert torch.equal(kv_scale_from_amax(torch.tensor([448.0]), 1.0), torch.tensor([448.0]) * R)
    with pytest.raises(ValueError, match="margin"):
        kv_scale_from_amax(amax, 0.9)
    # independent: scale = amax * margin / 448 by hand (floats), a zero amax floored at 1e-10 / 448
    by_hand = [448 * 1.05 / 448, 1.05 / 448, 1e-10 / 448, 3.5 * 1.05 / 448]  # 1.05, 0.00234375, ...
    assert got.tolist() == pytest.approx(by_hand, rel=1e-6)


def test_calibrator_percentile_and_margin_on_hand_built_amaxes():
    """5 micro-batches, 2 layers; layer 0's k amax is 1, 2, 3, 4, 100 across micro-batches."""
    k_amax = [1.0, 2.0, 3.0, 4.0, 100.0]
    median = QKVCalibrator(2, KVCalibration(percentile=50.0, margin=1.0))
    high = QKVCalibrator(2, KVCalibration())  # 99.9th percentile, margin 1.05
    for a in k_amax:
        for layer in (0, 1):  # one forward: layer 0 opens the record
            q, k, v = qkv(8.0, a if layer == 0 else 0.5, 2.0 + layer)
            for calib in (median, high):
                assert calib(layer, q, k, v) == (q, k, v)  # observes, changes nothing
    assert median.num_micro_batches == 5
    scales = median.scales()
    assert scales.k[0].item() == (torch.tensor(3.0) * R).item()  # median of 1..4, 100 with margin 1
    assert torch.equal(scales.q, torch.full((2,), 8.0) * R)
    assert torch.equal(scales.v, torch.tensor([2.0, 3.0]) * R)
    want = float(np.percentile(k_amax, 99.9)) * 1.05 / 448  # 99.616 * 1.05 / 448
    assert high.scales().k[0].item() == pytest.approx(want, rel=1e-6)
    assert high.amax()[1, 1].item() == 0.5


def test_records_of_scratch_calibrators_give_the_scales_of_one_observing_all():
    """A captured forward observes with a scratch calibrator of its own and hands its record over (`last_record` ->
    `add_record`): the scales equal those of one calibrator that saw every forward."""
    cal = KVCalibration(percentile=50.0, margin=1.0)
    whole, taker = QKVCalibrator(2, cal), QKVCalibrator(2, cal)
    for a in (1.0, 3.0, 2.0):
        scratch = QKVCalibrator(2, cal)
        for layer in (0, 1):
            for c in (whole, scratch):
                c(layer, *qkv(a, 2 * a + layer, 0.5))
        taker.add_record(scratch.last_record())
    assert taker.num_micro_batches == 3
    assert torch.equal(taker.amax(), whole.amax())
    median_k = [4.0 * float(R), 5.0 * float(R)]  # layer 0: median of 2a, layer 1: of 2a + 1
    assert taker.scales().k.tolist() == pytest.approx(median_k, rel=1e-6)
    with pytest.raises(ValueError, match=r"a record is \[2, 3\]"):
        taker.add_record(torch.zeros(3, 3))
    partial = QKVCalibrator(2)
    with pytest.raises(ValueError, match="no complete forward"):
        partial.last_record()
    partial(0, *qkv(1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="no complete forward"):
        partial.last_record()


def test_calibrator_errors():
    with pytest.raises(ValueError, match="num_layers"):
        QKVCalibrator(0)
    calib = QKVCalibrator(2)
    with pytest.raises(ValueError, match="nothing observed"):
        calib.scales()
    calib(0, *qkv(1.0, 1.0, 1.0))  # a forward that never reached its last layer
    with pytest.raises(ValueError, match="incomplete"):
        calib.scales()
    with pytest.raises(ValueError, match="out of range"):
        calib(2, *qkv(1.0, 1.0, 1.0))
    calib.reset()
    assert calib.num_micro_batches == 0


def test_fake_quant_bitwise_equals_the_fp8_cache_round_trip():
    """The trainer's fake-quant gives exactly the K/V the rollout's FP8 cache hands to attention."""
    torch.manual_seed(0)
    k = (torch.randn(3, 2, 5, 128) * 2).bfloat16()
    v = (torch.randn(3, 2, 5, 128) * 0.5).bfloat16()
    k_scale, v_scale = torch.tensor([0.004, 0.01]), torch.tensor([0.002, 0.0009])  # v's small: clamps
    cache = KVCache(2, 3, 2, 8, 128, dtype=torch.float8_e4m3fn)
    cache.set_scales(k_scale, v_scale)
    k_read, v_read = cache.update(1, k, v, 0)
    assert torch.equal(k_read, kv_fake_quant(k, k_scale[1]))
    assert torch.equal(v_read, kv_fake_quant(v, v_scale[1]))
    assert torch.equal(cache.k[1, :, :, :5].view(torch.uint8), kv_quant(k, k_scale[1]).view(torch.uint8))
    assert v_read.abs().max().item() == pytest.approx(448 * 0.0009, rel=1e-2)  # saturated, not inf/NaN


def test_fake_quant_error_bound_and_straight_through_gradient():
    torch.manual_seed(1)
    x = torch.randn(4, 2, 7, 128, dtype=torch.float32, requires_grad=True)
    scale = kv_scale_from_amax(x.detach().abs().max(), 1.05)
    y = kv_fake_quant(x, scale)
    err = y.detach() - x.detach()
    sqnr_db = 10 * torch.log10(x.detach().pow(2).mean() / err.pow(2).mean())
    assert 25.0 < sqnr_db.item() < 40.0  # e4m3: 3 mantissa bits (measured 31 dB)
    grad = torch.randn_like(x)
    (y * grad).sum().backward()
    assert torch.equal(x.grad, grad)  # straight-through: identity gradient
    assert torch.equal(kv_dequant(kv_quant(x.detach(), scale), scale, torch.float32), y.detach())


def test_fake_quant_by_slices_is_the_whole_round_trip_bitwise_with_the_input_layout():
    """Slicing along S bounds the FP32 temporaries; the bits, the layout and the gradient stay the whole tensor's."""
    torch.manual_seed(2)
    base = (torch.randn(2, 37, 3, 16) * 3).bfloat16().requires_grad_()  # [B, S, H, D]
    k = base.transpose(1, 2)  # [B, H, S, D] view, as the decoder hands it over
    scale = torch.tensor(0.01)
    whole = kv_dequant(kv_quant(k.detach(), scale), scale, k.dtype)
    for slice_elements in (1, 96, 2 * 3 * 16 * 5 + 7, k.numel()):
        sliced = kv_fake_quant(k, scale, slice_elements=slice_elements)
        assert torch.equal(sliced.detach().view(torch.int16), whole.view(torch.int16)), slice_elements
        assert sliced.stride() == k.stride()
    grad = torch.randn_like(sliced)
    (sliced.float() * grad.float()).sum().backward()
    assert torch.equal(base.grad.transpose(1, 2), grad)


def test_make_attn_hook_observes_raw_then_quantizes():
    calib = QKVCalibrator(1)
    scales = KVScales(torch.tensor([0.01]), torch.tensor([0.01]), torch.tensor([0.01]))
    q, k, v = (t.float() * 3 for t in qkv(1.0, 1.0, 1.0))
    hook = make_attn_hook(calib, scales)
    q2, k2, v2 = hook(0, q, k, v)
    assert q2 is q and not torch.equal(k2, k) and torch.equal(k2, kv_fake_quant(k, scales.k[0]))
    assert calib.amax()[0, 1].item() == 3.0  # the raw value, before quantization
    q3, _, _ = make_attn_hook(None, scales, quantize_q=True)(0, q, k, v)
    assert torch.equal(q3, kv_fake_quant(q, scales.q[0]))
    assert make_attn_hook(None, None) is None


def test_kv_scales_validation_and_metrics():
    s = KVScales(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]), torch.tensor([0.5, 1.5]))
    assert s.num_layers == 2 and s.kv[0] is s.k
    assert s.metrics() == {
        "q_scale_mean": 2.0,
        "q_scale_max": 3.0,
        "k_scale_mean": 2.0,
        "k_scale_max": 2.0,
        "v_scale_mean": 1.0,
        "v_scale_max": 1.5,
    }
    with pytest.raises(ValueError, match="float32"):
        KVScales(torch.ones(2, dtype=torch.float64), torch.ones(2), torch.ones(2))
    with pytest.raises(ValueError, match="lengths differ"):
        KVScales(torch.ones(2), torch.ones(3), torch.ones(2))


def test_dense_storage_is_the_memory_run_of_a_permuted_contiguous_tensor():
    """The one-pass CUDA fake-quant runs over a tensor's memory: a contiguous tensor or a permutation of one gives
    its elements in memory order; a slice (gaps) or an expanded view (overlaps) gives None."""
    from nemo_jetrl.precision.kv import _dense_storage

    base = torch.arange(2 * 5 * 3 * 4, dtype=torch.float32).view(2, 5, 3, 4)  # [B, S, H, D]
    view = base.transpose(1, 2)  # [B, H, S, D]
    assert torch.equal(_dense_storage(view), base.reshape(-1))
    assert torch.equal(_dense_storage(base[1:]), base[1:].reshape(-1))  # a leading slice is still one run
    assert _dense_storage(base[:, :4]) is None and _dense_storage(base[..., :2]) is None
    assert _dense_storage(torch.zeros(3, 1).expand(3, 4)) is None
    assert _dense_storage(torch.zeros(0, 4)).numel() == 0


ROUND_TRIP_CHILD = """
import json, torch
from nemo_jetrl.precision.kernels import triton_quant

scale = torch.tensor([0.0123], dtype=torch.float32)
x = torch.cat([torch.randn(5000, generator=torch.Generator().manual_seed(4)), torch.tensor([0.0, -0.0])])
out = {}
for dtype in (torch.bfloat16, torch.float32):
    xd = x.to(dtype)
    buf = torch.empty_like(xd)
    got = triton_quant.kv_round_trip(xd, scale, out=buf)
    out[str(dtype)] = [got is buf, str(got.dtype), list(got.shape), [str(float(v)) for v in got[-2:]]]
for name, bad in (("2d", lambda: triton_quant.kv_round_trip(x[:5000].view(50, -1), scale)),
                  ("scales", lambda: triton_quant.kv_round_trip(x, torch.ones(2))),
                  ("out", lambda: triton_quant.kv_round_trip(x, scale, out=torch.empty(3)))):
    try:
        bad()
    except ValueError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def test_triton_kv_round_trip_layout_and_refusals(run_interpreted):
    """`triton_quant.kv_round_trip` (the trainer's one-pass K/V fake-quant on CUDA) under Triton's interpreter:
    the dtype and length kept, `out` written, signed zeros kept, bad inputs refused. The interpreter's e4m3 casts do
    not round as the GPU's (it halves some values), so the values' parity with `kv_dequant(kv_quant(...))`, bitwise,
    is the GPU test's (tests/gpu/test_precision_gpu.py, test_kv_fake_quant_one_pass_is_bitwise_the_round_trip)."""
    out = run_interpreted(ROUND_TRIP_CHILD)
    for dtype in ("torch.bfloat16", "torch.float32"):
        assert out[dtype] == [True, dtype, [5002], ["0.0", "-0.0"]]
    assert "contiguous [N] tensor" in out["2d"] and "one FP32 scale" in out["scales"]
    assert "out must be a contiguous (5002,)" in out["out"]
