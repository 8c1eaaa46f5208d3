"""The exact mode's attention and log-sum-exp: the float64 twins give the same bits for a query in decode, prefill and
training and stay close to SDPA / torch.logsumexp; the Triton kernels (interpreter, child process) agree with the
twins and give decode == prefill == training bitwise over several key blocks, FP8 cache included."""

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nemo_jetrl.models.batch_invariant import logsumexp_ref, logsumexp_rows
from nemo_jetrl.models.batch_invariant_attention import attention, paged_attention
from nemo_jetrl.models.batch_invariant_train import _forward, _Layout, causal_attention, packed_attention
from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.precision.kv import kv_dequant, kv_quant


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


def _case(seq: int = 24):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, seq, 32).bfloat16(), torch.randn(3, 2, seq, 32).bfloat16(), torch.randn(3, 2, seq, 32)
    valid = torch.ones(3, seq, dtype=torch.bool)
    valid[0, :5], valid[1, :9], valid[2, seq - 3 :] = False, False, False  # left pads; a right pad
    return q, k, v.bfloat16(), valid


def _sdpa(q, k, v, valid, scale):
    seq = q.shape[2]
    mask = (torch.arange(seq)[None] <= torch.arange(seq)[:, None]) & valid[:, None]
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(
        q.float(), k, v, attn_mask=mask[:, None] | torch.eye(seq, dtype=torch.bool), scale=scale
    )


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
def test_twin_decode_prefill_and_training_agree_bitwise(fp8):
    q, k, v, valid = _case()
    scale = 32**-0.5
    scales = (torch.tensor(0.02), torch.tensor(0.015)) if fp8 else (None, None)
    kc, vc = (kv_quant(k, scales[0]), kv_quant(v, scales[1])) if fp8 else (k, v)
    kt, vt = (kv_dequant(kc, scales[0], k.dtype), kv_dequant(vc, scales[1], v.dtype)) if fp8 else (k, v)
    train = attention(q, kt, vt, valid, 0, scale)  # [B, H, S, D]
    real = valid[:, None, :, None].expand_as(q)
    assert train.dtype == torch.bfloat16 and rel(train[real], _sdpa(q, kt, vt, valid, scale)[real]) < 5e-3
    pre = attention(q[:, :, :12], kc[:, :, :12], vc[:, :, :12], valid[:, :12], 0, scale, *scales)
    assert torch.equal(pre[real[:, :, :12]], train[:, :, :12][real[:, :, :12]])
    for col in (12, 17, 23):
        key_valid = valid.clone()
        key_valid[:, col + 1 :] = False
        out = attention(q[:, :, col : col + 1], kc, vc, key_valid, torch.tensor(col), scale, *scales)
        rows = valid[:, col]
        assert torch.equal(out[rows, :, 0], train[rows, :, col]), col
    assert not attention(q[:1, :, :5], kt[:1], vt[:1], valid[:1], 0, scale).any()  # pad queries see no key: 0


def test_causal_attention_gradient_is_sdpas():
    q, k, v, valid = _case()
    q, k, v = (t.float().requires_grad_() for t in (q, k, v))
    out = causal_attention(q, k, v, valid, 0.2)
    weight = valid[:, None, :, None].float()  # loss on real queries only, as the trainer's
    (out * weight).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (_sdpa(q, k, v, valid, 0.2) * weight).square().sum().backward()
    for got, t in zip(grads, (q, k, v)):
        assert rel(got, t.grad) < 1e-5


def _packed(t: torch.Tensor, packing: PackedRows) -> torch.Tensor:
    """[B, H, S, D] -> the packed row [1, H, T, D] of `packing` (zeros on its rounding slots)."""
    bsz, heads, seq, dim = t.shape
    rows = torch.cat([t.transpose(1, 2).reshape(bsz * seq, heads, dim), t.new_zeros(1, heads, dim)])
    return rows[packing.index].transpose(0, 1)[None].contiguous()


def test_trainer_forward_writes_the_log_sum_exp_and_packed_rows_equal_padded_rows_bitwise():
    q, k, v, valid = _case(40)
    valid[1, 30:] = False  # a right-padded row too
    out, lse = _forward(q, k, v, _Layout(key_valid=valid), 0.2)  # [B, H, S, D], [H, B * S]
    scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) * 0.2  # [B, H, S, S]
    allowed = (torch.arange(40)[None, :] <= torch.arange(40)[:, None]) & valid[:, None, :]  # [B, S, S]
    expected = torch.logsumexp(scores.masked_fill(~allowed[:, None], float("-inf")), -1)  # [B, H, S]
    expected = expected.transpose(0, 1).reshape(4, -1)
    real = valid.flatten()
    assert float((lse[:, real].double() - expected[:, real]).abs().max()) < 1e-6  # natural log, fp32
    assert bool(torch.isinf(lse[:, ~real]).all())  # pad queries: +inf (no gradient)
    packing = PackedRows.from_mask(valid.long(), 8)  # 3 rows + a rounding segment
    p_out, p_lse = _forward(*(_packed(t, packing) for t in (q, k, v)), _Layout(cu_seqlens=packing.cu_seqlens), 0.2)
    slots = packing.real()[0]
    assert torch.equal(p_out[:, :, slots], _packed(out, packing)[:, :, slots])  # bitwise: same sums per query
    assert torch.equal(p_lse[:, slots], torch.cat([lse, lse[:, :1]], 1)[:, packing.index][:, slots])


def test_packed_trainer_attention_gradient_is_per_sequence_sdpas():
    """The twin backward (flash attention's formulas over the forward's output and log-sum-exp) against SDPA run
    on each sequence alone, every query scored (the rounding segment's too)."""
    q, k, v, valid = _case(40)
    packing = PackedRows.from_mask(valid.long(), 8)
    q, k, v = (_packed(t, packing).float().requires_grad_() for t in (q, k, v))
    weight = torch.linspace(0.5, 1.5, q.shape[2])[None, None, :, None]
    ours = packed_attention(q, k, v, packing, 0.2)
    (ours * weight).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    bounds = packing.cu_seqlens.tolist()
    out = torch.cat([
        F.scaled_dot_product_attention(q[:, :, lo:hi], k[:, :, lo:hi].repeat_interleave(2, 1),
                                       v[:, :, lo:hi].repeat_interleave(2, 1), is_causal=True, scale=0.2)
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ], dim=2)  # fmt: skip
    assert rel(ours, out) < 1e-6  # float64 twin rounded once vs float32 SDPA
    (out * weight).square().sum().backward()
    for got, t in zip(grads, (q, k, v)):
        assert rel(got, t.grad) < 1e-5  # measured ~3e-7


def test_logsumexp_twin_is_batch_invariant_close_and_differentiable():
    torch.manual_seed(1)
    x = (torch.randn(6, 9000) * 4).requires_grad_()
    lse = logsumexp_rows(x)
    assert torch.equal(logsumexp_rows(x[2:3])[0], lse[2])
    assert rel(lse, torch.logsumexp(x.double(), -1)) < 1e-7
    lse.sum().backward()
    assert rel(x.grad, torch.softmax(x.detach().double(), -1)) < 1e-6
    assert logsumexp_rows(x.detach().reshape(2, 3, 9000)).shape == (2, 3)
    with pytest.raises(ValueError, match="float32"):
        logsumexp_rows(x.detach().double())
    assert torch.equal(logsumexp_ref(x.detach()), lse.detach())


CHILD = textwrap.dedent(
    """
    import json, torch
    from nemo_jetrl.models import batch_invariant_kernels as K
    from nemo_jetrl.models.batch_invariant import logsumexp_ref
    from nemo_jetrl.models.batch_invariant_attention import attention_ref
    from nemo_jetrl.precision.kv import kv_dequant, kv_quant

    def rel(a, b):
        return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())

    torch.manual_seed(0)
    B, H, HKV, D, S, P = 3, 4, 2, 32, 150, 40  # 150 keys: three 64-key blocks
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, HKV, S, D), torch.randn(B, HKV, S, D)
    valid = torch.ones(B, S, dtype=torch.bool)
    valid[0, :7], valid[1, :70], valid[2, 145:] = False, False, False
    zero = torch.zeros((), dtype=torch.long)
    r = {"rel": [], "prefill": [], "decode": []}
    for fp8 in (False, True):
        sc = (torch.tensor(0.02), torch.tensor(0.015)) if fp8 else (None, None)
        kc, vc = (kv_quant(k, sc[0]), kv_quant(v, sc[1])) if fp8 else (k, v)
        kt, vt = (kv_dequant(kc, sc[0], torch.float32), kv_dequant(vc, sc[1], torch.float32)) if fp8 else (k, v)
        train = K.attention(q, kt, vt, valid, zero, 0.125)
        real = valid[:, None, :, None].expand_as(q)
        r["rel"].append(rel(train[real], attention_ref(q, kt, vt, valid, 0, 0.125)[real]))
        k_buf, v_buf = torch.zeros_like(kc), torch.zeros_like(vc)
        k_buf[:, :, :P], v_buf[:, :, :P] = kc[:, :, :P], vc[:, :, :P]
        pre = K.attention(q[:, :, :P], k_buf, v_buf, valid[:, :P], zero, 0.125, *sc)
        r["prefill"].append(torch.equal(pre[real[:, :, :P]], train[:, :, :P][real[:, :, :P]]))
        for t in (P, 64, 71, 128, 149):
            k_buf[:, :, : t + 1], v_buf[:, :, : t + 1] = kc[:, :, : t + 1], vc[:, :, : t + 1]
            key_valid = valid.clone()
            key_valid[:, t + 1 :] = False
            out = K.attention(q[:, :, t : t + 1], k_buf, v_buf, key_valid, torch.tensor(t), 0.125, *sc)
            rows = valid[:, t]
            per_row = K.attention(q[:, :, t : t + 1], k_buf, v_buf, key_valid, torch.full((B,), t), 0.125, *sc)
            r["decode"].append(torch.equal(out[rows, :, 0], train[rows, :, t]) and torch.equal(per_row, out))
    # the trainer's forward: padded rows with their log-sum-exp, and the same rows packed (VARLEN), a fixed layout
    # with empty segments too (a captured micro-batch's)
    from nemo_jetrl.models.batch_invariant_train import varlen_attention_ref
    from nemo_jetrl.models.packed import PackedRows
    train, lse_pad = K.padded_train_attention(q, k, v, valid, 0.125)  # K.attention at every query's own column
    r["packed"], r["packed_rel"] = [], []
    for packing in (PackedRows.from_mask(valid.long(), 64),
                    PackedRows.from_mask(valid.long(), 64, width=512, segments=8, longest=S)):
        def pk(t):
            rows = torch.cat([t.transpose(1, 2).reshape(B * S, t.shape[1], D), t.new_zeros(1, t.shape[1], D)])
            return rows[packing.index].transpose(0, 1)[None].contiguous()
        out, lse = K.varlen_attention(pk(q), pk(k), pk(v), packing.cu_seqlens, packing.max_seqlen, 0.125)
        slots = packing.real()[0]
        flat = torch.cat([lse_pad, lse_pad[:, :1]], 1)[:, packing.index]
        r["packed"].append(torch.equal(out[:, :, slots], pk(train)[:, :, slots]) and torch.equal(lse[:, slots], flat[:, slots]))
        ref, ref_lse = varlen_attention_ref(pk(q), pk(k), pk(v), packing.cu_seqlens, 0.125)
        r["packed_rel"] += [rel(out, ref), float((lse - ref_lse).abs().max())]
    x = torch.randn(5, 10000) * 3
    from nemo_jetrl.models.batch_invariant_lse_kernel import row_logsumexp

    lse = row_logsumexp(x)
    r["lse_rel"] = rel(lse, logsumexp_ref(x))
    r["lse_row"] = torch.equal(row_logsumexp(x[2:3])[0], lse[2])
    # the interpreter's tl.dot is numpy's matmul on the tiles: whether its BLAS gives a tile's rows the same bits
    # at every tile shape (OpenBLAS's FMA kernels on some CPUs do not)
    import numpy as np
    a, c = np.random.default_rng(0).standard_normal((2, 128, 128), dtype=np.float32)
    r["blas_tile_invariant"] = bool(np.array_equal((a @ c)[:1], a[:1] @ c) and np.array_equal((a @ c)[:64], a[:64] @ c))
    print(json.dumps(r))
    """
)


def test_triton_attention_and_logsumexp_in_the_interpreter(run_interpreted):
    pytest.importorskip("triton")
    r = run_interpreted(CHILD)
    assert len(r["decode"]) == 10 and max(r["rel"]) < 1e-6 and r["lse_rel"] < 1e-6 and r["lse_row"]
    # prefill / decode rows equal to the full pass bitwise need a BLAS whose tile products do not depend on the
    # tile shape (tests/gpu/test_batch_invariant_gpu.py checks the compiled kernels bitwise everywhere)
    assert len(r["packed_rel"]) == 4 and max(r["packed_rel"]) < 1e-5  # outputs and log-sum-exp vs the twin
    if r["blas_tile_invariant"]:
        assert all(r["prefill"]) and all(r["decode"])
        assert r["packed"] == [True, True]  # a packed token: the padded training forward's bits (so the decode's)


def _paged_case(dtype, page: int, lengths: list[int], seed: int = 0):
    """Rows of `lengths` keys scattered over shuffled blocks of a pool [blocks, H_kv, page, D] (block 0: the trash
    block, holding garbage), and the same keys left-padded into a contiguous buffer [B, H_kv, S, D] (the one-batch
    path's layout: row b's keys in its last lengths[b] columns). Returns q, pools, table, kv_len, buffers, key_valid."""
    gen = torch.Generator().manual_seed(seed)
    bsz, heads, kv_heads, dim = len(lengths), 4, 2, 32
    per_row = [-(-n // page) for n in lengths]
    num_blocks = 1 + sum(per_row) + 3  # a few blocks no row holds
    k_pool = (torch.randn(num_blocks, kv_heads, page, dim, generator=gen) * 3).to(dtype)
    v_pool = torch.randn(num_blocks, kv_heads, page, dim, generator=gen).to(dtype)
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(bsz, max(per_row) + 2, dtype=torch.int32)  # [B, M]; unused entries -> the trash block
    width = max(lengths) + 5
    k_buf = torch.zeros(bsz, kv_heads, width, dim, dtype=dtype)
    v_buf, key_valid = torch.zeros_like(k_buf), torch.zeros(bsz, width, dtype=torch.bool)
    for b, (n, m) in enumerate(zip(lengths, per_row)):
        table[b, :m] = torch.tensor(order[:m], dtype=torch.int32)
        order = order[m:]
        for pool, buf in ((k_pool, k_buf), (v_pool, v_buf)):
            keys = pool[table[b, :m].long()].transpose(0, 1).reshape(kv_heads, m * page, dim)[:, :n]  # [H_kv, n, D]
            buf[b, :, width - n :] = keys
        key_valid[b, width - n :] = True
    q = torch.randn(bsz, heads, 1, dim, generator=gen).bfloat16()
    return q, k_pool, v_pool, table, torch.tensor(lengths), k_buf, v_buf, key_valid


def _kernel_paged_vs_contiguous(lengths: list[int], seed: int) -> tuple[list[bool], list[float]]:
    """For the interpreter's children: the Triton paged decode step against the contiguous kernel over the same
    keys left-padded (bitwise), and its largest relative error against the twin, for a bf16 and an e4m3 pool."""
    from nemo_jetrl.models import batch_invariant_kernels as K
    from nemo_jetrl.models.batch_invariant_attention import paged_attention_ref

    same, errors = [], []
    for fp8 in (False, True):
        q, k_pool, v_pool, table, kv_len, k_buf, v_buf, key_valid = _paged_case(torch.float32, 16, lengths, seed=seed)
        q = q.float()
        sc = (torch.tensor(0.02), torch.tensor(0.015)) if fp8 else (None, None)
        if fp8:
            k_pool, v_pool = kv_quant(k_pool, sc[0]), kv_quant(v_pool, sc[1])
            k_buf, v_buf = kv_quant(k_buf, sc[0]), kv_quant(v_buf, sc[1])
        paged = K.paged_attention(q, k_pool, v_pool, table, kv_len, 0.125, *sc)
        start = torch.full((len(lengths),), k_buf.shape[2] - 1)
        same.append(torch.equal(paged, K.attention(q, k_buf, v_buf, key_valid, start, 0.125, *sc)))
        errors.append(rel(paged, paged_attention_ref(q, k_pool, v_pool, table, kv_len, 0.125, *sc)))
    return same, errors


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
def test_paged_twin_equals_the_left_padded_contiguous_twin_bitwise(fp8):
    lengths = [1, 7, 64, 65, 150]  # one key, within a block, a whole 64-key block, across blocks
    q, k_pool, v_pool, table, kv_len, k_buf, v_buf, key_valid = _paged_case(torch.bfloat16, 16, lengths)
    scales = (None, None)
    if fp8:
        scales = (torch.tensor(0.02), torch.tensor(0.015))
        k_pool, v_pool = kv_quant(k_pool, scales[0]), kv_quant(v_pool, scales[1])
        k_buf, v_buf = kv_quant(k_buf, scales[0]), kv_quant(v_buf, scales[1])  # elementwise: the same codes
    paged = paged_attention(q, k_pool, v_pool, table, kv_len, 0.125, *scales)  # [B, H, 1, D]
    start = torch.full((len(lengths),), k_buf.shape[2] - 1)  # every query at the buffer's last column
    contiguous = attention(q, k_buf, v_buf, key_valid, start, 0.125, *scales)
    assert paged.shape == (5, 4, 1, 32) and paged.dtype == torch.bfloat16
    assert torch.equal(paged, contiguous)
    for b, n in enumerate(lengths):  # each row alone, over exactly its own keys
        alone = attention(q[b : b + 1], k_buf[b : b + 1, :, -n:], v_buf[b : b + 1, :, -n:], key_valid[b : b + 1, -n:],
                          n - 1, 0.125, *scales)  # fmt: skip
        assert torch.equal(alone[0], paged[b]), b
    kt = kv_dequant(k_buf, scales[0], torch.float32) if fp8 else k_buf.float()
    vt = kv_dequant(v_buf, scales[1], torch.float32) if fp8 else v_buf.float()
    sdpa = F.scaled_dot_product_attention(
        q.float(), kt.repeat_interleave(2, 1), vt.repeat_interleave(2, 1), attn_mask=key_valid[:, None, None], scale=0.125
    )  # fmt: skip
    assert rel(paged, sdpa) < 5e-3  # bf16 output rounding


def test_paged_attention_refuses_what_it_cannot_read():
    q, k_pool, v_pool, table, kv_len, *_ = _paged_case(torch.bfloat16, 4, [3, 9])
    with pytest.raises(ValueError, match="one query per row"):
        paged_attention(q.expand(-1, -1, 2, -1), k_pool, v_pool, table, kv_len, 0.1)
    with pytest.raises(ValueError, match="block_table must be int32"):
        paged_attention(q, k_pool, v_pool, table.long(), kv_len, 0.1)
    with pytest.raises(ValueError, match="kv_len must be int64"):
        paged_attention(q, k_pool, v_pool, table, kv_len.int(), 0.1)
    with pytest.raises(ValueError, match="an e4m3 cache needs k_scale and v_scale"):
        paged_attention(q, kv_quant(k_pool, torch.tensor(0.1)), kv_quant(v_pool, torch.tensor(0.1)), table, kv_len, 0.1)


PAGED_CHILD = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, HERE)
    from test_batch_invariant_attention import _kernel_paged_vs_contiguous

    same, errors = _kernel_paged_vs_contiguous([1, 16, 64, 65, 130], seed=1)
    print(json.dumps({"contiguous": same, "rel": errors}))
    """
)


def test_triton_paged_attention_in_the_interpreter_equals_the_contiguous_kernel(run_interpreted):
    pytest.importorskip("triton")
    r = run_interpreted(PAGED_CHILD.replace("HERE", repr(str(Path(__file__).parent))))
    assert r["contiguous"] == [True, True]  # bf16 and e4m3 pools: the same bits as the left-padded cache
    assert len(r["rel"]) == 2 and max(r["rel"]) < 1e-6


LONG_PAD_CHILD = textwrap.dedent(
    """
    import json, torch
    from nemo_jetrl.models import batch_invariant_kernels as K
    from nemo_jetrl.models.batch_invariant_attention import attention_ref

    torch.manual_seed(0)
    S, P = 1200, 1090  # row 0: 1,090 pads (past the first 1,024-column step of the kernel's first-key scan)
    q, k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 1, S, 16), torch.randn(2, 1, S, 16)
    k[1, :, : S - P], v[1, :, : S - P] = k[0, :, P:], v[0, :, P:]  # row 1: the same keys, no padding
    q[1] = q[0]
    valid = torch.ones(2, S, dtype=torch.bool)
    valid[0, :P], valid[1, S - P :] = False, False
    start = torch.tensor([S - 1, S - P - 1])
    out = K.attention(q, k, v, valid, start, 0.25)  # [2, 2, 1, 16]
    ref = attention_ref(q, k, v, valid, start, 0.25)
    print(json.dumps({"same": torch.equal(out[0], out[1]), "err": float((out - ref).abs().max())}))
    """
)


def test_triton_attention_first_key_past_the_scans_first_step(run_interpreted):
    """The kernel finds a row's first valid key in 1,024-column steps: a row padded past the first step gets the bits
    of the same keys unpadded (the key blocks start at the first key) and the twin's values."""
    pytest.importorskip("triton")
    r = run_interpreted(LONG_PAD_CHILD)
    assert r["same"] and r["err"] < 1e-5


CHUNK_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, HERE)
    from test_batch_invariant_attention import _kernel_paged_vs_contiguous
    from nemo_jetrl.models import batch_invariant_kernels as K
    from nemo_jetrl.models.batch_invariant_attention import attention_ref

    torch.manual_seed(0)
    B, H, HKV, D, S = 2, 4, 2, 16, 300  # 300 keys: 5 chunks of 64 keys
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, HKV, S, D), torch.randn(B, HKV, S, D)
    valid = torch.ones(B, S, dtype=torch.bool)
    valid[0, :37] = False  # chunks start at the row's first valid key
    r = {"split_vs_inline": [], "rel": [], "decode_vs_train": [], "paged_vs_contiguous": [], "splits": []}
    launches = []  # the keys each call hands _run_chunks (0: one program over all chunks)
    run_chunks = K._run_chunks

    def recording(launch, out, kv_heads, block_m, keys):
        launches.append(keys)
        run_chunks(launch, out, kv_heads, block_m, keys)

    K._run_chunks = recording
    K.ATTN_SPLIT_KEYS = 64
    train = K.attention(q, k, v, valid, torch.tensor(0), 0.25)  # [B, H, S, D]: chunks merged as they end
    for col in (40, 128, 299):
        kv = valid.clone()
        kv[:, col + 1 :] = False
        qd, start = q[:, :, col : col + 1], torch.tensor(col)
        split_out = K.attention(qd, k, v, kv, start, 0.25)  # one program a chunk, then the merge kernel
        lse = torch.empty(H, B)
        inline = K.attention(qd, k, v, kv, start, 0.25, lse=lse)  # the same tile, chunks merged in one program
        r["split_vs_inline"].append(torch.equal(split_out, inline))
        r["decode_vs_train"].append(torch.equal(split_out[:, :, 0], train[:, :, col]))
        r["rel"].append(float((split_out - attention_ref(qd, k, v, kv, start, 0.25)).abs().max()))
    r["paged_vs_contiguous"], errors = _kernel_paged_vs_contiguous([1, 64, 65, 200, 290], seed=2)
    r["rel"] += errors
    r["splits"] = launches
    import numpy as np
    a, c = np.random.default_rng(0).standard_normal((2, 64, 64), dtype=np.float32)
    r["blas_tile_invariant"] = bool(np.array_equal((a @ c)[:16], a[:16] @ c))
    print(json.dumps(r))
    """
)


def test_triton_decode_runs_its_key_chunks_in_parallel_with_the_trainers_bits(run_interpreted):
    """A decode step over more than ATTN_SPLIT_KEYS keys runs one program a chunk and merges them after (flash
    decoding): the same bits as one program merging the same chunks as it goes (the trainer's way), for contiguous
    and paged caches, bf16 and e4m3, with chunks of 64 keys counted from a row's first valid key; and the twin's
    values."""
    pytest.importorskip("triton")
    r = run_interpreted(CHUNK_CHILD.replace("HERE", repr(str(Path(__file__).parent))))
    assert len(r["split_vs_inline"]) == 3 and all(r["split_vs_inline"])
    assert r["paged_vs_contiguous"] == [True] * 2
    assert max(r["rel"]) < 1e-5
    assert 300 in r["splits"] and 336 in r["splits"] and 0 in r["splits"]  # decode steps split; training did not
    if r["blas_tile_invariant"]:  # the interpreter's dots are numpy's matmuls (see the first interpreter test)
        assert all(r["decode_vs_train"])
