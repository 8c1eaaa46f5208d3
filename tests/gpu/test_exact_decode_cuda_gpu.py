"""The CUDA exact decode (`models/exact_decode_cuda.py`) on the GPU: the Triton exact kernel's bits, bit for bit,
over paged pools and contiguous caches (left padding, masked holes), one to five chunks of keys, 1 to 8 query heads
a KV head, every stage count, queries of several magnitudes; the decode step takes it where it serves, and the
decode still equals the trainer's tile (a prefill over the dequantized cache). Its parity with the float64 twin
(`batch_invariant_attention.attention_ref`) is the Triton kernel's (test_batch_invariant_gpu): the bits are equal.

Run: `python -m pytest -q -m gpu tests/gpu/test_exact_decode_cuda_gpu.py`.
"""

import pytest
import torch
import triton

from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.models import exact_cuda_choice, exact_decode_cuda
from nemo_jetrl.models.batch_invariant_attention import paged_attention
from nemo_jetrl.precision.kv import kv_dequant

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
FP8 = torch.float8_e4m3fn
SM = 128**-0.5
if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the CUDA exact decode serves sm_90", allow_module_level=True)


def _e4m3(gen, *shape, mag=1.0):
    return (torch.randn(*shape, generator=gen, device=DEV) * 100 * mag).clamp(-448, 448).to(FP8)


def _paged(bsz, kv_heads, n_rep, lens, page=16, qmag=1.0, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    per_row = -(-max(lens) // page)
    blocks = bsz * per_row + 3
    table = torch.randperm(blocks, generator=gen, device=DEV)[: bsz * per_row].int().view(bsz, per_row)
    k_pool, v_pool = _e4m3(gen, blocks, kv_heads, page, 128), _e4m3(gen, blocks, kv_heads, page, 128)
    q = (torch.randn(bsz, kv_heads * n_rep, 1, 128, generator=gen, device=DEV) * qmag).bfloat16()
    kv_len = torch.tensor(lens, dtype=torch.int64, device=DEV)
    return q, k_pool, v_pool, table, kv_len, torch.tensor(0.013, device=DEV), torch.tensor(0.0071, device=DEV)


def _cuda_paged(q, k_pool, v_pool, table, kv_len, ks, vs, stages=exact_decode_cuda.STAGES):
    out = torch.empty(q.shape[0], 1, q.shape[1], 128, dtype=q.dtype, device=DEV)
    exact_decode_cuda.decode(q, k_pool, v_pool, None, kv_len - 1, SM, ks, vs, out, table, stages=stages)
    return out.transpose(1, 2)


@pytest.mark.parametrize("qmag", [0.05, 1.0, 30.0])
def test_paged_8b_heads_mixed_lengths_equal_the_triton_kernel(qmag):
    lens = [int(x) for x in torch.randint(1, 4200, (64,), generator=torch.Generator().manual_seed(int(qmag * 7)))]
    lens[:8] = [1, 64, 65, 1024, 1025, 2048, 4096, 4111]  # one key, a block's edges, the chunks' edges
    case = _paged(64, 8, 4, lens, qmag=qmag, seed=int(qmag * 7))
    ref = K.paged_attention(*case[:5], SM, *case[5:])
    assert torch.equal(ref, _cuda_paged(*case))


@pytest.mark.parametrize("n_rep, kv_heads", [(1, 4), (2, 8), (5, 3), (8, 2)])
def test_query_heads_per_kv_head(n_rep, kv_heads):
    case = _paged(12, kv_heads, n_rep, [436] * 4 + [17, 700, 1500, 3000] * 2, seed=n_rep)
    assert torch.equal(K.paged_attention(*case[:5], SM, *case[5:]), _cuda_paged(*case))


@pytest.mark.parametrize("stages", [2, 4])
def test_stage_counts_give_the_same_bits(stages):
    case = _paged(16, 8, 4, [3000] * 16, seed=3)
    assert torch.equal(_cuda_paged(*case), _cuda_paged(*case, stages=stages))


def test_contiguous_cache_with_padding_and_holes():
    gen = torch.Generator(device=DEV).manual_seed(5)
    bsz, width = 32, 2200
    k_buf, v_buf = _e4m3(gen, bsz, 8, width, 128), _e4m3(gen, bsz, 8, width, 128)
    q = torch.randn(bsz, 16, 1, 128, generator=gen, device=DEV).bfloat16()
    cols = torch.arange(width, device=DEV)
    valid = (cols >= torch.tensor([0, 3, 70, 200] * 8, device=DEV)[:, None]) & (cols % 97 != 5)
    q_start = torch.tensor([2199, 1000, 436, 2150] * 8, device=DEV)
    scales = torch.tensor(0.011, device=DEV), torch.tensor(0.0093, device=DEV)
    ref = K.attention(q, k_buf, v_buf, valid, q_start, SM, *scales)
    out = torch.empty(bsz, 1, 16, 128, dtype=q.dtype, device=DEV)
    exact_decode_cuda.decode(q, k_buf, v_buf, valid, q_start, SM, *scales, out)
    assert torch.equal(ref, out.transpose(1, 2))


def test_the_decode_takes_it_and_equals_the_trainers_tile():
    """`batch_invariant_attention.paged_attention` (the decode's entry) runs the CUDA kernel here, and its output
    equals the trainer's configuration (a prefill over the dequantized, gathered cache) at the last query of each
    row."""
    lens = [5, 300, 1030, 2500]
    case = _paged(4, 8, 4, lens, seed=11)
    q, k_pool, v_pool, table, kv_len, ks, vs = case
    assert exact_cuda_choice.serves(q, k_pool, v_pool, None, paged=True)
    launches = []
    real = exact_decode_cuda.launch
    exact_decode_cuda.launch = lambda *a, **kw: (launches.append(1), real(*a, **kw))[1]
    try:
        got = paged_attention(q, k_pool, v_pool, table, kv_len, SM, ks, vs)
    finally:
        exact_decode_cuda.launch = real
    assert launches == [1]
    width = max(lens)
    for b, n in enumerate(lens):  # the trainer's tile over row b's keys, its last query
        blocks = table[b, : triton.cdiv(n, 16)].long()
        k = kv_dequant(k_pool[blocks].transpose(0, 1).reshape(8, -1, 128)[None, :, :n], ks, torch.bfloat16)
        v = kv_dequant(v_pool[blocks].transpose(0, 1).reshape(8, -1, 128)[None, :, :n], vs, torch.bfloat16)
        qs = q[b : b + 1].expand(1, 32, n, 128).contiguous()  # the same query at every position
        valid = torch.ones(1, n, dtype=torch.bool, device=DEV)
        zero = torch.zeros((), dtype=torch.int64, device=DEV)
        full = K.attention(qs, k, v, valid, zero, SM)  # [1, H, n, D]: position n - 1 sees all n keys
        assert torch.equal(full[0, :, -1], got[b, :, 0]), (b, n, width)
