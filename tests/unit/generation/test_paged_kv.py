"""Paged KV on CPU: the pure-torch twins against the slot references, block copies, and the Triton paged decode /
write kernels through Triton's interpreter (a child process) against the twins."""

import pytest
import torch

from nemo_jetrl.generation.native.decode_attention import decode_attention_ref
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.generation.native.paged_kv_cache import (
    PagedKVCache,
    gather_pages,
    paged_decode_attention_ref,
    paged_write_ref,
)
from nemo_jetrl.precision.kv import kv_quant

PAGE, BLOCKS, HKV, D = 4, 12, 2, 16


def scattered_table() -> torch.Tensor:
    """3 rows of 3 blocks each, block ids out of order and never 0 (the trash block)."""
    return torch.tensor([[7, 2, 11], [3, 9, 1], [5, 10, 4]], dtype=torch.int32)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_paged_reference_equals_the_slot_reference_on_the_gathered_rows(fp8):
    torch.manual_seed(0)
    k_pool = torch.randn(BLOCKS, HKV, PAGE, D).bfloat16()
    v_pool = torch.randn(BLOCKS, HKV, PAGE, D).bfloat16()
    ks = vs = None
    if fp8:
        ks, vs = torch.tensor(0.01), torch.tensor(0.02)
        k_pool, v_pool = kv_quant(k_pool, ks), kv_quant(v_pool, vs)
    table, kv_len = scattered_table(), torch.tensor([1, 7, 12])
    q = torch.randn(3, 4, D).bfloat16()
    out = paged_decode_attention_ref(q, k_pool, v_pool, table, kv_len, 0.25, ks, vs)
    k, v = gather_pages(k_pool, table), gather_pages(v_pool, table)  # [3, H_kv, 12, D]
    assert torch.equal(k[1, :, 5], k_pool[9, :, 1])  # token 5 of row 1: block table[1, 1] = 9, offset 1
    for b, n in enumerate(kv_len.tolist()):
        valid = torch.ones(1, n, dtype=torch.bool)
        ref = decode_attention_ref(q[b : b + 1], k[b : b + 1], v[b : b + 1], valid, n, 0.25, ks, vs)
        assert torch.equal(out[b : b + 1], ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_paged_write_is_bitwise_the_slot_cache_write(dtype):
    torch.manual_seed(0)
    slots = KVCache(1, 3, HKV, 3 * PAGE, D, dtype=dtype)
    paged = PagedKVCache(1, BLOCKS, HKV, PAGE, D, 3, 3, dtype=dtype)
    scales = (torch.tensor([0.02]), torch.tensor([0.03]))
    if dtype != torch.bfloat16:
        slots.set_scales(*scales)
        paged.set_scales(*scales)
    paged.table.copy_(scattered_table())
    cols = torch.tensor([0, 11, 6])  # [B] each row's own column
    k, v = (3 * torch.randn(3, HKV, 1, D)).bfloat16(), (3 * torch.randn(3, HKV, 1, D)).bfloat16()
    slots.update(0, k, v, cols)
    paged_write_ref(paged.k[0], paged.v[0], k, v, cols + 1, paged.table, *paged.layer_scales(0))
    assert torch.equal(gather_pages(paged.k[0], paged.table).view(torch.uint8), slots.k[0].view(torch.uint8))
    assert torch.equal(gather_pages(paged.v[0], paged.table).view(torch.uint8), slots.v[0].view(torch.uint8))
    written = paged.k[0].float().ne(0).any(-1).sum()  # [blocks, H_kv, page] positions written
    assert written == 3 * HKV and paged.k[0, 0].float().abs().sum() == 0  # the trash block untouched
    paged_write_ref(paged.k[0], paged.v[0], k, v, cols + 1, paged.table, *paged.layer_scales(0))  # idempotent
    assert torch.equal(gather_pages(paged.k[0], paged.table).view(torch.uint8), slots.k[0].view(torch.uint8))


def test_write_blocks_copies_a_prefill_into_its_blocks_and_pads_the_last():
    paged = PagedKVCache(2, BLOCKS, HKV, PAGE, D, 1, 3)
    k, v = torch.randn(2, HKV, 6, D).bfloat16(), torch.randn(2, HKV, 6, D).bfloat16()  # [L, H_kv, 6, D]
    paged.write_blocks([8, 3], k, v)
    paged.table[0] = torch.tensor([8, 3, 0], dtype=torch.int32)
    for layer in range(2):
        assert torch.equal(gather_pages(paged.k[layer], paged.table)[0, :, :6], k[layer])
        assert torch.equal(gather_pages(paged.v[layer], paged.table)[0, :, :6], v[layer])
    assert paged.k[:, 3, :, 2:].abs().sum() == 0  # block 3 holds tokens 4, 5 and zeros
    with pytest.raises(ValueError, match="6 tokens .* do not fit 1 blocks"):
        paged.write_blocks([1], k, v)


CHILD = r"""
import json, torch
from nemo_jetrl.generation.native.decode_attention import decode_attention, write_decode_kv
from nemo_jetrl.generation.native.paged_kv_cache import paged_decode_attention_ref, paged_write_ref
from nemo_jetrl.precision.kv import kv_quant
torch.manual_seed(0)
table = torch.tensor([[7, 2, 11, 0], [3, 9, 1, 6], [5, 10, 4, 8]], dtype=torch.int32)  # [B, 4] pages of 16
res = {}
for name in ("bf16", "fp8"):
    k_pool, v_pool = torch.randn(12, 2, 16, 64).bfloat16(), torch.randn(12, 2, 16, 64).bfloat16()
    ks = vs = None
    if name == "fp8":
        ks, vs = torch.tensor(0.01), torch.tensor(0.02)
        k_pool, v_pool = kv_quant(k_pool, ks), kv_quant(v_pool, vs)
    q = torch.randn(3, 8, 64)  # fp32 queries: exact fp32 dots in the interpreter
    kv_len = torch.tensor([1, 40, 64])
    errs = []
    for splits in (1, 3):
        out = decode_attention(q, k_pool, v_pool, None, kv_len, 0.125, ks, vs, block_table=table, num_splits=splits,
                               impl="triton")
        ref = paged_decode_attention_ref(q, k_pool, v_pool, table, kv_len, 0.125, ks, vs)
        errs.append(((out - ref).abs().max() / ref.abs().max()).item())
    res[name + "_attn_rel"] = max(errs)
kb, vb = torch.zeros(12, 2, 16, 64).bfloat16(), torch.zeros(12, 2, 16, 64).bfloat16()
kr, vr = kb.clone(), vb.clone()
k, v = torch.randn(3, 2, 1, 64).bfloat16(), torch.randn(3, 2, 1, 64).bfloat16()
kv_len = torch.tensor([1, 33, 64])
write_decode_kv(kb, vb, k, v, kv_len, block_table=table)
paged_write_ref(kr, vr, k, v, kv_len, table)
res["write_equal"] = bool(torch.equal(kb, kr) and torch.equal(vb, vr)) and bool(kb.ne(0).any())
print(json.dumps(res))
"""


def test_triton_paged_kernels_match_their_twins_in_the_interpreter(run_interpreted):
    res = run_interpreted(CHILD)
    assert res["bf16_attn_rel"] < 1e-5 and res["fp8_attn_rel"] < 1e-5, res
    assert res["write_equal"], res
