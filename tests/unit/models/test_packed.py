"""Packed rows (models/packed.py): the layout map, the varlen attention twin against per-sequence attention, and
`sequence_logprobs(pack_round=...)` against the padded forward (values and gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nemo_jetrl.models.batch_invariant import enable_batch_invariant
from nemo_jetrl.models.decoder import decoder_forward
from nemo_jetrl.models.forward_plan import EAGER, ForwardInputs, ForwardPlan
from nemo_jetrl.models.packed import PackedRows, block_causal_mask, varlen_causal_attention
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8


def _mask() -> torch.Tensor:
    """[4, 7]: left-padded prompts, right-padded responses, one all-padding row."""
    return torch.tensor([[0, 0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0]])


def test_packing_lays_rows_end_to_end_with_their_padded_positions():
    packing = PackedRows.from_mask(_mask(), round_to=4)  # 3 + 7 + 2 = 12 real tokens, 12 slots
    assert packing.cu_seqlens.tolist() == [0, 3, 10, 12] and packing.max_seqlen == 7
    assert packing.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1]]
    packing = PackedRows.from_mask(_mask(), round_to=8)  # 16 slots: a 4-slot segment of rounding
    assert packing.cu_seqlens.tolist() == [0, 3, 10, 12, 16] and packing.width == 16
    x = torch.arange(28).view(4, 7)
    packed = packing.pack(x, fill=-1)  # [1, 16]
    assert packed.tolist() == [[2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 22, 23, -1, -1, -1, -1]]
    assert torch.equal(packing.unpack(packed), x * _mask())  # real tokens back in place, 0 elsewhere
    assert packing.real().sum() == 12


def test_a_fixed_layout_pads_slots_and_segments_and_bounds_the_longest_segment():
    packing = PackedRows.from_mask(_mask(), round_to=4, width=30, segments=8, longest=7)  # 12 real tokens, 30 slots
    # 3 rows, the 18 rounding slots in pieces of at most 7, then 2 empty segments
    assert packing.cu_seqlens.tolist() == [0, 3, 10, 12, 19, 26, 30, 30, 30]
    assert packing.width == 30 and packing.max_seqlen == 7 and packing.real().sum() == 12
    x = torch.arange(28).view(4, 7)
    packed = packing.pack(x, fill=-1)
    assert packed[0, 12:].tolist() == [-1] * 18
    assert torch.equal(packing.unpack(packed), x * _mask())
    assert PackedRows.from_mask(_mask(), round_to=4, width=12).max_seqlen == 12  # no rounding slots: no segment
    with pytest.raises(ValueError, match="a packed row of 8 slots cannot hold 12 tokens"):
        PackedRows.from_mask(_mask(), round_to=4, width=8)
    with pytest.raises(ValueError, match="6 segments .* exceed the 5 asked for"):
        PackedRows.from_mask(_mask(), round_to=4, width=30, segments=5, longest=7)
    with pytest.raises(ValueError, match="the longest segment \\(6\\) must be at least the row width 7"):
        PackedRows.from_mask(_mask(), round_to=4, width=30, longest=6)


def test_block_causal_mask_keeps_each_segment_to_itself():
    mask = block_causal_mask(torch.tensor([0, 2, 5], dtype=torch.int32), 5)[0, 0].int()
    assert mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]


def test_the_attention_twin_is_per_sequence_causal_attention():
    gen = torch.Generator().manual_seed(0)
    packing = PackedRows.from_mask(_mask(), round_to=8)
    q = torch.randn(1, 4, 16, 8, generator=gen)  # [1, H, T, D]
    k, v = torch.randn(1, 2, 16, 8, generator=gen), torch.randn(1, 2, 16, 8, generator=gen)  # grouped K/V

    def repeat_kv(t, n):
        return t.repeat_interleave(n, dim=1)

    out = varlen_causal_attention(q, k, v, packing, 0.3, repeat_kv)  # [1, H, T, D]
    bounds = packing.cu_seqlens.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ref = F.scaled_dot_product_attention(
            q[:, :, lo:hi], repeat_kv(k[:, :, lo:hi], 2), repeat_kv(v[:, :, lo:hi], 2), is_causal=True, scale=0.3
        )
        torch.testing.assert_close(out[:, :, lo:hi], ref, rtol=0, atol=1e-6)


def _case():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 30, (8, 40), generator=gen)
    mask = torch.ones_like(ids)
    mask[:3, :6] = 0  # left-padded prompts
    mask[5:, 33:] = 0  # right-padded responses
    mask[7] = 0  # an all-padding row
    return ids, mask, torch.linspace(0.5, 1.5, 40)


def _pass(model, ids, mask, weights, pack_round):
    model.zero_grad()
    logp = sequence_logprobs(model, ids, mask, pack_round=pack_round)
    (logp * weights).sum().backward()
    grads = torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])
    return logp.detach().double(), grads


@pytest.mark.parametrize("pack_round", [1, 16])
def test_packed_logprobs_and_gradients_equal_the_padded_forwards(pack_round):
    ids, mask, weights = _case()
    model = random_tiny_qwen3(0, num_layers=2)  # fp32
    padded_logp, padded_grads = _pass(model, ids, mask, weights, None)
    packed_logp, packed_grads = _pass(model, ids, mask, weights, pack_round)
    assert bool((packed_logp[mask == 0] == 0).all()) and bool((packed_logp[:, 0] == 0).all())
    assert float((packed_logp - padded_logp).abs().max()) < 5e-5  # measured 8.6e-6: fp32 sums of other lengths
    assert float((packed_grads - padded_grads).norm() / padded_grads.norm()) < 1e-5  # measured 7.3e-7


def test_packed_fp8_is_as_accurate_as_padded_fp8_against_fp64():
    ids, mask, weights = _case()
    ref_logp, ref_grads = _pass(random_tiny_qwen3(0, num_layers=2).double(), ids, mask, weights, None)
    model = random_tiny_qwen3(0, num_layers=2)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    (padded_logp, padded_grads), (packed_logp, packed_grads) = (_pass(model, ids, mask, weights, r) for r in (None, 16))
    assert float((packed_logp - padded_logp).abs().max()) < 5e-5  # FProp: per-token 1x128 groups, unchanged
    err_padded = float((padded_grads - ref_grads).norm() / ref_grads.norm())
    err_packed = float((packed_grads - ref_grads).norm() / ref_grads.norm())
    assert 0 < err_padded and err_packed <= 1.05 * err_padded, (err_packed, err_padded)  # measured 0.2110 / 0.2111


@pytest.mark.parametrize("pack_round", [1, 4])
def test_a_micro_batch_of_padding_only_gives_zeros(pack_round):
    mask = torch.zeros(3, 5, dtype=torch.long)
    packing = PackedRows.from_mask(mask, pack_round)  # one segment of rounding slots
    assert packing.cu_seqlens.tolist() == [0, pack_round] and packing.width == pack_round
    logp = sequence_logprobs(random_tiny_qwen3(0, num_layers=1), torch.ones_like(mask), mask, pack_round=pack_round)
    assert torch.equal(logp, torch.zeros(3, 5))


def test_decoder_forward_refuses_packing_it_cannot_honour():
    ids, mask, _ = _case()
    packing = PackedRows.from_mask(mask)
    packed_ids = packing.pack(ids)
    model = random_tiny_qwen3(0, num_layers=1)
    with pytest.raises(ValueError, match="packed rows need one row of 248 tokens"):
        decoder_forward(
            model, ids, packing.position_ids.expand(8, -1)[:, :40], mask, EAGER, ForwardInputs(packed=packing)
        )
    enable_batch_invariant(model)
    plan = ForwardPlan.trainer(model, None, fused_train=False)  # the exact parts the model now runs
    out = decoder_forward(
        model, packed_ids, packing.position_ids, packing.real().long(), plan, ForwardInputs(packed=packing)
    )
    assert out.shape == (1, 248, model.config.hidden_size)  # the exact mode runs packed rows (its varlen kernel)


def test_in_the_exact_mode_packed_logprobs_equal_the_padded_bitwise():
    """The batch-invariant linears and attention give a packed token the padded layout's bits (the rollout's too:
    tests/functional/test_packed_on_policy.py); the gradients (flash-backward twin over the forward's output and
    log-sum-exp, float64 sums in other orders) agree closely."""
    ids, mask, weights = _case()
    model = random_tiny_qwen3(0, num_layers=2)  # fp32
    enable_batch_invariant(model)
    padded_logp, padded_grads = _pass(model, ids, mask, weights, None)
    for pack_round in (1, 16):
        packed_logp, packed_grads = _pass(model, ids, mask, weights, pack_round)
        assert torch.equal(packed_logp, padded_logp), pack_round
        assert float((packed_grads - padded_grads).norm() / padded_grads.norm()) < 1e-6  # measured 1.2e-7


def test_a_packed_forward_builds_no_dense_mask(monkeypatch):
    """The packed row attends by its segments: the padded path's [B, 1, S, S] mask would be [1, 1, T, T] here, ~T^2
    bytes built and thrown away (71 GB at a 135K-token logprob micro-batch, Qwen3-8B at 16K tokens, H200)."""
    import nemo_jetrl.models.decoder as decoder

    built = []
    real = decoder._attention_mask
    monkeypatch.setattr(decoder, "_attention_mask", lambda m, *a: built.append(tuple(m.shape)) or real(m, *a))
    model, mask = random_tiny_qwen3(0), _mask()
    ids = torch.randint(3, 30, mask.shape, generator=torch.Generator().manual_seed(0))
    packed = sequence_logprobs(model, ids, mask, pack_round=4)
    assert built == []
    padded = sequence_logprobs(model, ids, mask)
    assert built == [tuple(mask.shape)]  # the padded forward still masks its pads
    assert torch.allclose(packed, padded, atol=1e-5)
