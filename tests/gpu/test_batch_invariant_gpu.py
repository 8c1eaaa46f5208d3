"""The exact mode's kernels on CUDA at Qwen3-8B shapes: one row computed alone equals the same row inside a batch of
64 (and inside the trainer's and the prefill's larger products), bitwise; decode, prefill and training attention give
the same bits for the same query; each kernel stays within an error bound of its reference.

Run: `python -m pytest -q -m gpu tests/gpu/test_batch_invariant_gpu.py` (docs/mismatch.md quotes the run).
"""

import pytest
import torch
import torch.nn.functional as F

from nemo_jetrl.models.batch_invariant import logsumexp_rows
from nemo_jetrl.models.batch_invariant_attention import attention, attention_ref
from nemo_jetrl.precision import act_quant, fp8_blockwise_mm, weight_quant
from nemo_jetrl.precision import batch_invariant as bi
from nemo_jetrl.precision.kv import kv_dequant, kv_quant

pytestmark = pytest.mark.gpu
DEV = "cuda"
# (N, K) of the Qwen3-8B linears: grouped q/k/v, o_proj, grouped gate/up, down_proj
FP8_SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]
ROWS = (0, 1, 37, 63)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _fp8_operands(m: int, n: int, k: int, seed: int):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(m, k, device=DEV, generator=gen)
    w = torch.randn(n, k, device=DEV, generator=gen) * 0.02
    return (*act_quant(x), *weight_quant(w))


@pytest.mark.parametrize(("n", "k"), FP8_SHAPES)
def test_fp8_gemm_row_does_not_depend_on_the_batch(n, k):
    from nemo_jetrl.precision.kernels import triton_batch_invariant as T

    xq, xs, wq, ws = _fp8_operands(4096, n, k, n + k)
    big = bi.fp8_mm(xq, xs, wq, ws, torch.bfloat16)  # [4096, N]: the trainer's micro-batch size (wide tiles)
    batch = bi.fp8_mm(xq[:64], xs[:64], wq, ws, torch.bfloat16)  # a decode batch (narrow tiles, split chunks)
    assert torch.equal(batch, big[:64])
    for row in ROWS:
        alone = bi.fp8_mm(xq[row : row + 1], xs[row : row + 1], wq, ws, torch.bfloat16)
        assert torch.equal(alone[0], batch[row]), row
    # every tile configuration and both chunk schedules give the same bits (the decode tuner picks among them)
    ref = T.fp8_gemm(xq[:300], xs[:300], wq, ws, torch.float32, config=(64, 64, 4, 4), split=False)
    candidates = {*T.DECODE_CANDIDATES, *(((128, 128, 8, 3), s) for s in (False, True))}
    for config, split in sorted(candidates | {((64, 64, 4, 4), True), ((128, 64, 8, 3), True)}):
        out = T.fp8_gemm(xq[:300], xs[:300], wq, ws, torch.float32, config=config, split=split)
        assert torch.equal(out, ref), (config, split)
    emulated = fp8_blockwise_mm(xq[:300], xs[:300], wq, ws, torch.float32, backend="emulated")
    assert rel_err(ref, emulated) < 1e-3  # the same FP8 bits; tensor-core FP8 accumulation differs


def test_fp8_gemm_grouped_equals_separate_and_the_twin_is_close():
    """The rollout runs q/k/v (gate/up) as one GEMM over the shared buffer, the trainer one GEMM per linear."""
    xq, xs, wq, ws = _fp8_operands(256, 6144, 4096, 1)
    grouped = bi.fp8_mm(xq, xs, wq, ws, torch.bfloat16)
    parts = [
        bi.fp8_mm(xq, xs, wq[a:b], ws[a // 128 : b // 128], torch.bfloat16)
        for a, b in ((0, 4096), (4096, 5120), (5120, 6144))
    ]
    assert torch.equal(grouped, torch.cat(parts, dim=1))
    twin = bi.fp8_mm_ref(xq.cpu(), xs.cpu(), wq.cpu(), ws.cpu(), torch.float32)
    assert rel_err(bi.fp8_mm(xq, xs, wq, ws, torch.float32).cpu(), twin) < 1e-3


def test_bf16_mm_row_does_not_depend_on_the_batch():
    """The lm_head (Qwen3-8B vocabulary) and a BF16 layer's projection."""
    from nemo_jetrl.precision.kernels import triton_batch_invariant as T

    gen = torch.Generator(device=DEV).manual_seed(0)
    for n, k in ((151936, 4096), (4096, 4096)):
        x = torch.randn(2048, k, device=DEV, generator=gen).bfloat16()
        w = (torch.randn(n, k, device=DEV, generator=gen) * 0.02).bfloat16()
        big = bi.mm(x, w)
        batch = bi.mm(x[:64], w)
        assert torch.equal(batch, big[:64])
        for row in ROWS:
            assert torch.equal(bi.mm(x[row : row + 1], w)[0], batch[row]), row
        for config in ((64, 128, 4, 4), (128, 128, 8, 3), (64, 64, 4, 4)):
            assert torch.equal(T.mm(x[:300], w, config=config), big[:300]), config
        assert rel_err(big[:300], x[:300].float() @ w.float().t()) < 1e-2  # bf16 output rounding


def _attention_case(fp8: bool):
    """Qwen3-8B heads (32 query, 8 KV, dim 128), 4 rows of 600 columns with left pads and a right pad."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    bsz, heads, kv_heads, dim, seq = 4, 32, 8, 128, 600
    q = torch.randn(bsz, heads, seq, dim, device=DEV, generator=gen).bfloat16()
    k = torch.randn(bsz, kv_heads, seq, dim, device=DEV, generator=gen).bfloat16()
    v = torch.randn(bsz, kv_heads, seq, dim, device=DEV, generator=gen).bfloat16()
    valid = torch.ones(bsz, seq, dtype=torch.bool, device=DEV)
    valid[0, :13], valid[1, :200], valid[3, 590:] = False, False, False
    if not fp8:
        return q, k, v, k, v, valid, (None, None)
    ks, vs = torch.tensor(0.011, device=DEV), torch.tensor(0.009, device=DEV)
    kc, vc = kv_quant(k, ks), kv_quant(v, vs)  # the FP8 cache; the trainer reads its fake-quant values
    return q, kc, vc, kv_dequant(kc, ks, torch.bfloat16), kv_dequant(vc, vs, torch.bfloat16), valid, (ks, vs)


@pytest.mark.parametrize("chunk", [None, 512, 128], ids=["default_chunks", "chunks_of_512", "chunks_of_128"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_kv", "fp8_kv"])
def test_attention_decode_prefill_and_training_agree_bitwise(monkeypatch, fp8, chunk):
    """The trainer's forward, the prefill and decode steps over the static cache give the same bits; the keys come
    in chunks (ATTN_SPLIT_KEYS: the default, one chunk a row here; 512, crossed by the last decode steps; 128), a
    decode step's chunks in parallel programs merged after, the trainer's merged as it goes."""
    from nemo_jetrl.models import batch_invariant_kernels as K

    if chunk is not None:
        monkeypatch.setattr(K, "ATTN_SPLIT_KEYS", chunk)
    q, kc, vc, kt, vt, valid, scales = _attention_case(fp8)
    scale = 128**-0.5
    train = attention(q, kt, vt, valid, 0, scale)  # [B, H, S, D]: the trainer's forward (causal)
    real = valid[:, None, :, None].expand_as(q)
    n_rep = q.shape[1] // kt.shape[1]
    seq = q.shape[2]
    mask = (torch.arange(seq, device=DEV)[None] <= torch.arange(seq, device=DEV)[:, None]) & valid[:, None]
    sdpa = F.scaled_dot_product_attention(
        q.float(), kt.float().repeat_interleave(n_rep, 1), vt.float().repeat_interleave(n_rep, 1),
        attn_mask=mask[:, None] | torch.eye(seq, dtype=torch.bool, device=DEV), scale=scale,
    )  # fmt: skip
    assert rel_err(train[real], sdpa[real]) < 1e-2
    twin = attention_ref(q[:1, :, :130], kt[:1], vt[:1], valid[:1], 0, scale)
    assert rel_err(train[:1, :, 13:130], twin[:, :, 13:]) < 1e-2
    prompt = 256
    k_buf, v_buf = torch.zeros_like(kc), torch.zeros_like(vc)
    k_buf[:, :, :prompt], v_buf[:, :, :prompt] = kc[:, :, :prompt], vc[:, :, :prompt]
    k_pre, v_pre = k_buf[:, :, :prompt], v_buf[:, :, :prompt]  # the prefix the decoder hands over
    pre = attention(q[:, :, :prompt], k_pre, v_pre, valid[:, :prompt], 0, scale, *scales)  # the prefill
    keep = real[:, :, :prompt]
    assert torch.equal(pre[keep], train[:, :, :prompt][keep])
    for col in (prompt, 300, 383, 384, 511, 589):  # decode steps over the static cache, one query per row
        k_buf[:, :, : col + 1], v_buf[:, :, : col + 1] = kc[:, :, : col + 1], vc[:, :, : col + 1]
        key_valid = valid.clone()
        key_valid[:, col + 1 :] = False
        start = torch.tensor(col, device=DEV)
        out = attention(q[:, :, col : col + 1], k_buf, v_buf, key_valid, start, scale, *scales)
        rows = valid[:, col]
        assert torch.equal(out[rows, :, 0], train[rows, :, col]), col
        per_row = attention(q[:, :, col : col + 1], k_buf, v_buf, key_valid, start.expand(4).clone(), scale, *scales)
        assert torch.equal(per_row, out), col


def test_logsumexp_row_does_not_depend_on_the_batch():
    gen = torch.Generator(device=DEV).manual_seed(4)
    x = torch.randn(2048, 151936, device=DEV, generator=gen) * 4
    big = logsumexp_rows(x)
    batch = logsumexp_rows(x[:64])
    assert torch.equal(batch, big[:64])
    for row in ROWS:
        assert torch.equal(logsumexp_rows(x[row : row + 1])[0], batch[row]), row
    assert rel_err(big, torch.logsumexp(x.double(), -1)) < 1e-6


@pytest.mark.parametrize(
    "config", [(16, 4, 2), (16, 4, 3), (16, 4, 4), (32, 4, 3), (64, 4, 2), (64, 4, 3), (128, 4, 2)], ids=str
)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_kv", "fp8_kv"])
def test_attention_decode_config_gives_the_default_bits(fp8, config):
    """A decode step (4 query rows of one KV head: 1 position x 4 heads) under another tile / warp configuration
    equals the decode default's (`DECODE_CONFIG`) bitwise: the tile's width (query rows) and the pipeline depth do
    not change a query's reductions; (64, 4, 3) is the prefill's and the trainer's."""
    from nemo_jetrl.models import batch_invariant_kernels as K

    q, kc, vc, _, _, valid, scales = _attention_case(fp8)
    scale = 128**-0.5
    for col in (256, 383, 511, 589):
        key_valid = valid.clone()
        key_valid[:, col + 1 :] = False
        start = torch.tensor(col, device=DEV)
        args = (q[:, :, col : col + 1], kc, vc, key_valid, start, scale, *scales)
        assert torch.equal(K.attention(*args, config=config), K.attention(*args)), col


@pytest.mark.parametrize(("n", "k"), FP8_SHAPES)
def test_cublas_fp8_row_at_decode_prefill_and_trainer_sizes(n, k):
    """The fast path's cuBLAS FP8 GEMM (`backend="scaled_mm"`): a row of a decode batch (64 rows) equals the same
    row in the trainer's (4,096) and the prefill's (16,384) product; the matched kernels' pin
    (`backend="scaled_mm_padded"`, what `use_cublas_fprop` runs at every M) gives fewer rows the same bits too (they
    are padded to 64: cuBLAS's own choice at 2-16 rows differed at K = 12,288 on an H200, 2026-11-28/29)."""
    xq, xs, wq, ws = _fp8_operands(16384, n, k, n + 2 * k)
    prefill = fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16, backend="scaled_mm")
    train = fp8_blockwise_mm(xq[:4096], xs[:4096], wq, ws, torch.bfloat16, backend="scaled_mm")
    decode = fp8_blockwise_mm(xq[:64], xs[:64], wq, ws, torch.bfloat16, backend="scaled_mm")
    same = {
        "decode==train": (decode == train[:64]).all().item(),
        "train==prefill": (train == prefill[:4096]).all().item(),
    }
    for m in (1, 3, 8, 16, 61):
        padded = fp8_blockwise_mm(xq[:m], xs[:m], wq, ws, torch.bfloat16, backend="scaled_mm_padded")
        same[f"padded {m}==train"] = (padded == train[:m]).all().item()
    print(n, k, same)
    assert all(same.values()), same
