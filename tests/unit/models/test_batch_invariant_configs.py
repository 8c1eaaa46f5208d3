"""Which tile configuration each launch of the exact attention kernel takes (`batch_invariant_kernels`): the
launches are intercepted, so no GPU and no interpreter run. The configurations' speed: docs/mismatch.md; that they
give the same bits: tests/gpu/test_batch_invariant_gpu.py and the sm_90 compile test."""

import pytest
import torch

pytest.importorskip("triton")

from nemo_jetrl.models import batch_invariant_kernels as K  # noqa: E402


def test_each_launch_takes_its_layouts_pipeline_depth(monkeypatch):
    """A decode step runs DECODE_CONFIG over the contiguous cache (one chunk or parallel chunks) and
    PAGED_DECODE_CONFIG over a paged pool, both within DECODE_MAXNREG registers at 16 bits (float32: the trainer's
    tile, no budget); the trainer's forward TRAIN_CONFIG with no budget; an explicit config wins."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                record = (kw.get("num_stages"), kw.get("BLOCK_M"), kw.get("SPLIT_OUT", False), kw.get("maxnreg"))
                launches.append(record)

            return launch

    monkeypatch.setattr(K, "_attention_kernel", Recorder())
    monkeypatch.setattr(K, "_merge_splits_kernel", Recorder())
    bsz, heads, kv_heads, dim = 2, 4, 2, 16
    q = torch.randn(bsz, heads, 1, dim)
    scale, zero = 0.25, torch.tensor(0)

    def stages_of(run) -> tuple:
        launches.clear()
        run()
        return launches[0]

    one_chunk = torch.randn(bsz, kv_heads, K.ATTN_SPLIT_KEYS, dim).bfloat16()
    two_chunks = torch.randn(bsz, kv_heads, K.ATTN_SPLIT_KEYS + 1, dim).bfloat16()
    valid = torch.ones(bsz, K.ATTN_SPLIT_KEYS + 1, dtype=torch.bool)
    qb = q.bfloat16()
    budget = K.DECODE_MAXNREG
    assert budget == 128
    assert stages_of(lambda: K.attention(qb, one_chunk, one_chunk, valid, zero, scale)) == (3, 16, False, budget)
    assert stages_of(lambda: K.attention(qb, two_chunks, two_chunks, valid, zero, scale)) == (3, 16, True, budget)
    assert len(launches) == 2  # the split decode's merge kernel
    assert stages_of(lambda: K.attention(qb, two_chunks, two_chunks, valid, zero, scale, config=(16, 4, 2)))[0] == 2
    pool = torch.randn(9, kv_heads, 16, dim).bfloat16()
    table = torch.arange(1, 9, dtype=torch.int32).view(bsz, 4)
    kv_len = torch.tensor([64, 30])
    paged = stages_of(lambda: K.paged_attention(qb, pool, pool, table, kv_len, scale))
    assert paged == (2, 16, False, budget)
    fp32_pool = pool.float()
    assert stages_of(lambda: K.paged_attention(q, fp32_pool, fp32_pool, table, kv_len, scale)) == (3, 64, False, None)
    prefill = torch.randn(bsz, heads, 8, dim).bfloat16()
    keys = one_chunk[:, :, :8]
    assert stages_of(lambda: K.attention(prefill, keys, keys, valid, zero, scale)) == (3, 64, False, None)
    lse = torch.empty(heads, bsz)
    assert stages_of(lambda: K.attention(qb, keys, keys, valid, zero, scale, lse=lse)) == (3, 16, False, budget)
    fp32 = one_chunk.float()
    assert stages_of(lambda: K.attention(q, fp32, fp32, valid, zero, scale)) == (3, 64, False, None)


def test_the_lengths_compile_one_variant_whatever_their_alignment():
    """S_q, S_k and svalb follow the prompt length: they are not specialized on divisibility by 16, so a width in
    another class compiles nothing new mid-run (on an H200 the specialized kernel compiled 2 decode and 2 prefill
    variants over widths 692-720 and 180-208, this one 1 and 1: docs/mismatch.md); S_q == 1 (a decode step) still
    specializes, and no argument is left unspecialized altogether."""
    params = {p.name: p for p in K._attention_kernel.params}
    unaligned = {name for name, p in params.items() if p.do_not_specialize_on_alignment}
    assert unaligned == {"S_q", "S_k", "svalb"}
    assert not [name for name, p in params.items() if p.do_not_specialize]
