"""The CUDA exact trainer forward (`models/exact_train_cuda.py`) on the GPU: the Triton exact kernel's output bits,
bit for bit, and its log-sum-exp, over packed rows (segments of 1 to 4,111 tokens: one to five chunks) and padded
rows (left and right padding, masked holes), 1 to 8 query heads a KV head, several query magnitudes; the trainer's
forward takes it where it serves, its gradients are the Triton forward's (to flash attention's backward's
repeatability), and the rollout's decode still equals the
trainer's forward through it.

Run: `python -m pytest -q -m gpu tests/gpu/test_exact_train_cuda_gpu.py`.
"""

import pytest
import torch

from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.models import exact_cuda_choice, exact_train_cuda
from nemo_jetrl.models.batch_invariant_train import causal_attention, packed_attention
from nemo_jetrl.models.packed import PackedRows

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
SM = 128**-0.5
if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the CUDA exact trainer forward serves sm_90", allow_module_level=True)


def _rand(gen, *shape, mag=1.0):
    return (torch.randn(*shape, generator=gen, device=DEV) * mag).bfloat16()


def _packed(lens, kv_heads, n_rep, qmag=1.0, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    total = sum(lens)
    q = _rand(gen, 1, kv_heads * n_rep, total, 128, mag=qmag)
    k, v = _rand(gen, 1, kv_heads, total, 128), _rand(gen, 1, kv_heads, total, 128, mag=2.0)
    cu = torch.nn.functional.pad(torch.tensor(lens, device=DEV).cumsum(0), (1, 0)).int()
    return q, k, v, cu, max(lens)


def _assert_equal_to_triton_packed(q, k, v, cu, longest):
    ref, ref_lse = K.varlen_attention(q, k, v, cu, longest, SM)
    out, lse = exact_train_cuda.forward(q, k, v, None, cu, longest, SM)
    assert torch.equal(out, ref)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qmag", [0.05, 1.0, 30.0])
def test_packed_8b_heads_equal_the_triton_kernel(qmag):
    lens = [1, 2, 63, 64, 65, 1023, 1024, 1025, 2048, 4111, 700, 3000]  # a block's and the chunks' edges
    _assert_equal_to_triton_packed(*_packed(lens, 8, 4, qmag=qmag, seed=int(qmag * 10)))


@pytest.mark.parametrize("n_rep, kv_heads", [(1, 4), (2, 8), (3, 2), (8, 2)])
def test_query_heads_per_kv_head(n_rep, kv_heads):
    _assert_equal_to_triton_packed(*_packed([436, 17, 1500, 2100, 64], kv_heads, n_rep, seed=n_rep))


def test_padded_rows_with_padding_and_holes():
    gen = torch.Generator(device=DEV).manual_seed(3)
    bsz, seq = 6, 2300
    q, k, v = _rand(gen, bsz, 16, seq, 128, mag=4.0), _rand(gen, bsz, 8, seq, 128), _rand(gen, bsz, 8, seq, 128)
    cols = torch.arange(seq, device=DEV)
    lead = torch.tensor([0, 3, 70, 1100, 0, 2299], device=DEV)[:, None]
    valid = (cols >= lead) & (cols < lead + torch.tensor([2300, 1500, 2000, 900, 64, 1], device=DEV)[:, None])
    valid[1] &= cols % 97 != 5  # holes: the kernel reads the mask as the Triton kernel does
    ref_lse = torch.empty(16, bsz * seq, device=DEV)
    ref = K.attention(q, k, v, valid, torch.zeros((), dtype=torch.int64, device=DEV), SM, lse=ref_lse)
    out, lse = exact_train_cuda.forward(q, k, v, valid, None, 0, SM)
    assert torch.equal(out, ref)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6)


def test_the_trainer_takes_it_and_its_gradients_are_the_triton_forwards():
    q, k, v, cu, longest = _packed([300, 1500, 40, 2200], 8, 4, seed=9)
    packed = PackedRows(index=None, position_ids=None, cu_seqlens=cu, max_seqlen=longest, shape=(1, q.shape[2]))
    assert exact_cuda_choice.train_serves(q, k, v, packed=True)
    assert exact_cuda_choice.train_serves(q, k, v, packed=False)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = packed_attention(*leaves, packed, SM)
    assert torch.equal(out, K.varlen_attention(q, k, v, cu, longest, SM)[0])
    d_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, d_out)
    exact_cuda_choice._AGREES[("train", DEV.index or 0, 4, True)] = False  # the Triton forward, same backward
    try:
        leaves2 = [t.clone().requires_grad_() for t in (q, k, v)]
        grads2 = torch.autograd.grad(packed_attention(*leaves2, packed, SM), leaves2, d_out)
    finally:
        exact_cuda_choice._AGREES.pop(("train", DEV.index or 0, 4, True))
    for a, b in zip(grads, grads2):  # flash attention's backward accumulates dq by atomics: not bitwise repeatable
        torch.testing.assert_close(a, b)


def test_padded_trainer_forward_through_the_dispatch_equals_triton():
    gen = torch.Generator(device=DEV).manual_seed(4)
    bsz, seq = 4, 1200
    q, k, v = _rand(gen, bsz, 32, seq, 128), _rand(gen, bsz, 8, seq, 128), _rand(gen, bsz, 8, seq, 128)
    cols = torch.arange(seq, device=DEV)
    valid = (cols >= torch.tensor([0, 5, 300, 10], device=DEV)[:, None]) & (cols < 1150)
    ref = K.attention(q, k, v, valid, torch.zeros((), dtype=torch.int64, device=DEV), SM)
    assert torch.equal(causal_attention(q, k, v, valid, SM), ref)
