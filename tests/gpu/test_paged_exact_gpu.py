"""The exact mode over the paged KV pool on CUDA: the block-table attention kernel equals the contiguous kernel
bitwise for the same keys (Qwen3-8B heads, 64 rows, scattered pages, BF16 and FP8 KV), and a rollout under a
budget that preempts gives the trainer's forward logprobs and the unbudgeted rollout bit for bit.

Run: `python -m pytest -q -m gpu tests/gpu/test_paged_exact_gpu.py`.
"""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.models.batch_invariant_attention import attention, attention_ref, paged_attention
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.kv import kv_quant

from .test_grpo_gpu import SMALL_QWEN3, bootstrap_kv, parts

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def _paged_case(fp8: bool, page: int = 16):
    """64 rows of 1..700 keys in shuffled blocks of a pool [blocks, 8, page, 128], and the same keys left-padded into
    a contiguous cache [64, 8, S, 128] (the one-batch layout)."""
    gen = torch.Generator(device=DEV).manual_seed(7)
    bsz, heads, kv_heads, dim = 64, 32, 8, 128
    lengths = torch.randint(1, 701, (bsz,), generator=torch.Generator().manual_seed(7))
    lengths[:6] = torch.tensor([1, 16, 63, 64, 65, 700])  # one key, a page, around a 64-key block, the longest
    per_row = (lengths + page - 1) // page
    num_blocks = 1 + int(per_row.sum()) + 5
    k_pool = torch.randn(num_blocks, kv_heads, page, dim, device=DEV, generator=gen).bfloat16()
    v_pool = torch.randn(num_blocks, kv_heads, page, dim, device=DEV, generator=gen).bfloat16()
    scales = (None, None)
    if fp8:
        scales = (torch.tensor(0.011, device=DEV), torch.tensor(0.009, device=DEV))
        k_pool, v_pool = kv_quant(k_pool, scales[0]), kv_quant(v_pool, scales[1])
    order = torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(8)) + 1
    table = torch.zeros(bsz, int(per_row.max()) + 1, dtype=torch.int32)  # [B, M]
    ends = per_row.cumsum(0)
    for b in range(bsz):
        table[b, : per_row[b]] = order[ends[b] - per_row[b] : ends[b]].int()
    table = table.to(DEV)
    width = int(lengths.max()) + 3
    k_buf = torch.zeros(bsz, kv_heads, width, dim, device=DEV, dtype=k_pool.dtype)
    v_buf, valid = torch.zeros_like(k_buf), torch.zeros(bsz, width, dtype=torch.bool, device=DEV)
    for b, n in enumerate(lengths.tolist()):
        blocks = table[b, : per_row[b]].long()
        for pool, buf in ((k_pool, k_buf), (v_pool, v_buf)):
            raw = pool.view(torch.uint8) if fp8 else pool
            rows = raw[blocks].transpose(0, 1).reshape(kv_heads, -1, dim)[:, :n]  # [H_kv, n, D]
            (buf.view(torch.uint8) if fp8 else buf)[b, :, width - n :] = rows
        valid[b, width - n :] = True
    q = torch.randn(bsz, heads, 1, dim, device=DEV, generator=gen).bfloat16()
    return q, k_pool, v_pool, table, lengths.to(DEV), k_buf, v_buf, valid, scales


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_kv", "fp8_kv"])
def test_paged_exact_attention_equals_the_contiguous_kernel_bitwise(fp8):
    q, k_pool, v_pool, table, kv_len, k_buf, v_buf, valid, scales = _paged_case(fp8)
    scale = 128**-0.5
    paged = paged_attention(q, k_pool, v_pool, table, kv_len, scale, *scales)  # [64, 32, 1, 128]
    start = torch.full((64,), k_buf.shape[2] - 1, device=DEV)
    contiguous = attention(q, k_buf, v_buf, valid, start, scale, *scales)
    assert torch.equal(paged, contiguous)
    graph = torch.cuda.CUDAGraph()  # the rollout captures its decode step
    with torch.cuda.graph(graph):
        captured = paged_attention(q, k_pool, v_pool, table, kv_len, scale, *scales)
    graph.replay()
    assert torch.equal(captured, paged)
    twin = attention_ref(q[:6], k_buf[:6], v_buf[:6], valid[:6], start[:6], scale, *scales)
    err = ((paged[:6].float() - twin.float()).norm() / twin.float().norm()).item()
    assert err < 1e-2, err  # bf16 output rounding


def test_small_qwen3_exact_mode_under_a_preempting_budget_is_bitwise_the_trainer():
    """32 rows of 48 prompt tokens + 32 generated over 40 usable 16-token FP8 blocks (preempted and recomputed,
    CUDA-graph buckets): tokens and logprobs == the unbudgeted exact rollout's, == the trainer's forward (mbs 8)."""
    torch.manual_seed(0)
    cfg = Qwen3Config(**SMALL_QWEN3)
    cfg._attn_implementation = "sdpa"
    with torch.device(DEV):
        model = Qwen3ForCausalLM(cfg).float()
    prompts = torch.randint(1, SMALL_QWEN3["vocab_size"], (32, 48), generator=torch.Generator().manual_seed(0))
    policy, whole = parts(model, None, PrecisionRecipe.preset("jetrl_kv"), mbs=8, max_new_tokens=32, deterministic=True)
    bootstrap_kv(policy, whole, prompts.tolist())
    token = KVCache.token_bytes(policy.model, torch.float8_e4m3fn)
    tight = whole.replace(kv_cache_memory_bytes=41 * 16 * token, kv_block_size=16)
    a = whole.generate(prompts.tolist(), generator=torch.Generator(DEV).manual_seed(2))
    b = tight.generate(prompts.tolist(), generator=torch.Generator(DEV).manual_seed(2))
    stats = tight.last_rollout_stats
    assert stats.num_blocks == 41 and stats.preemptions > 0 and stats.prefill_tokens_recomputed > 0
    assert torch.equal(b.input_ids, a.input_ids) and torch.equal(b.generation_logprobs, a.generation_logprobs)
    batch = TrainBatch(
        b.input_ids.cpu(), b.attention_mask.cpu(), b.response_mask.cpu(), torch.zeros(len(b)),
        b.generation_logprobs.float().cpu(),
    )  # fmt: skip
    trainer = policy.get_logprobs(batch)
    mask = batch.response_mask.bool()
    assert int(mask.sum()) == 32 * 32
    assert float((trainer[mask] == batch.generation_logprobs[mask]).float().mean()) == 1.0
