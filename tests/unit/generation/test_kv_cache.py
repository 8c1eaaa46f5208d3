"""KVCache: prefix/static reads, FP8 storage (bytes, round trip, exact bits), errors."""

import pytest
import torch

from nemo_jetrl.generation.native.kv_cache import FP8_E4M3_MAX, KVCache

L, B, H, S, D = 2, 3, 1, 10, 128


def test_prefix_and_static_updates():
    cache = KVCache(L, B, H, S, D, dtype=torch.float32)
    k = torch.randn(B, H, 4, D)
    v = torch.randn(B, H, 4, D)
    k_all, v_all = cache.update(1, k, v, 0)
    assert k_all.shape == (B, H, 4, D) and torch.equal(k_all, k) and torch.equal(v_all, v)
    k1, v1 = torch.randn(B, H, 1, D), torch.randn(B, H, 1, D)
    k_all, v_all = cache.update(1, k1, v1, torch.tensor(4))  # static form: the whole buffer
    assert k_all.shape == (B, H, S, D)
    assert torch.equal(k_all[:, :, :4], k) and torch.equal(k_all[:, :, 4:5], k1) and torch.equal(v_all[:, :, 4:5], v1)
    assert torch.equal(k_all[:, :, 5:], torch.zeros(B, H, S - 5, D))  # unwritten tail is zeros, never NaN
    assert torch.equal(cache.k[0], torch.zeros(B, H, S, D))  # other layers untouched


def test_bytes_per_token_fp8_halves_bf16():
    bf16 = KVCache(L, B, H, S, D, dtype=torch.bfloat16)
    fp8 = KVCache(L, B, H, S, D, dtype=torch.float8_e4m3fn)
    assert bf16.bytes_per_token == 2 * L * H * D * 2 == 1024
    assert fp8.bytes_per_token == 512
    assert fp8.nbytes * 2 == bf16.nbytes


@pytest.mark.parametrize("static", [False, True], ids=["prefix", "static"])
def test_fp8_round_trip_error_and_bits(static):
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(B, H, 6, D, generator=gen) * 3
    v = torch.randn(B, H, 6, D, generator=gen)
    k_scale = float(k.abs().max()) / FP8_E4M3_MAX
    v_scale = float(v.abs().max()) / FP8_E4M3_MAX * 0.5  # half the calibrated scale: the top values clamp
    cache = KVCache(L, B, H, S, D, dtype=torch.float8_e4m3fn)
    cache.set_scales(torch.tensor([1.0, k_scale]), torch.tensor([1.0, v_scale]))
    start = torch.tensor(2) if static else 2
    k_all, v_all = cache.update(1, k, v, start)
    k_rt, v_rt = k_all[:, :, 2:8], v_all[:, :, 2:8]
    assert k_rt.dtype == torch.float32
    # stored bits are exactly clamp(x / scale, -448, 448).to(e4m3)
    expected = torch.clamp(k / torch.tensor(k_scale), -448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(cache.k[1, :, :, 2:8].view(torch.uint8), expected.view(torch.uint8))
    # e4m3: 3 mantissa bits -> relative error <= 2^-4 for normals, absolute <= scale * 2^-10 for subnormals
    bound = torch.maximum(k.abs() * 2.0**-4, torch.full_like(k, k_scale * 2.0**-10))
    assert ((k_rt - k).abs() <= bound).all()
    assert (k_rt - k).abs().max().item() > 0  # really quantized
    # values past 448 * scale saturate at +-448 * scale
    v_cap = 448 * v_scale
    clamped = v.abs() > v_cap
    assert clamped.any()
    assert torch.allclose(v_rt[clamped].abs(), torch.full_like(v_rt[clamped], v_cap))
    inside = ~clamped
    assert (
        (v_rt - v).abs()[inside] <= torch.maximum(v.abs() * 2.0**-4, torch.tensor(v_scale * 2.0**-10))[inside]
    ).all()


def test_fp8_read_dtype_follows_input():
    cache = KVCache(L, B, H, S, D, dtype=torch.float8_e4m3fn)
    cache.set_scales(torch.full((L,), 0.01), torch.full((L,), 0.01))
    k_all, _ = cache.update(
        0, torch.randn(B, H, 1, D, dtype=torch.bfloat16), torch.randn(B, H, 1, D, dtype=torch.bfloat16), 0
    )
    assert k_all.dtype == torch.bfloat16


def test_errors():
    fp8 = KVCache(L, B, H, S, D, dtype=torch.float8_e4m3fn)
    k = torch.randn(B, H, 1, D)
    with pytest.raises(ValueError, match="set_scales"):
        fp8.update(0, k, k, 0)
    with pytest.raises(ValueError, match="k_scales"):
        fp8.set_scales(torch.ones(L + 1), torch.ones(L))
    with pytest.raises(ValueError, match="v_scales"):
        fp8.set_scales(torch.ones(L), torch.tensor([1.0, 0.0]))
    bf16 = KVCache(L, B, H, S, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="FP8"):
        bf16.set_scales(torch.ones(L), torch.ones(L))
    with pytest.raises(ValueError, match="outside"):
        bf16.update(0, k, k, S)
    with pytest.raises(ValueError, match="layer"):
        bf16.update(L, k, k, 0)
    with pytest.raises(ValueError, match="B=3"):
        bf16.update(0, k[:1], k[:1], 0)
    with pytest.raises(ValueError, match="positive"):
        KVCache(L, 0, H, S, D)
    with pytest.raises(ValueError, match="dtype"):
        KVCache(L, B, H, S, D, dtype=torch.int8)
