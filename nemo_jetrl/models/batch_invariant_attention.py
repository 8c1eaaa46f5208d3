"""The exact mode's attention: one reduction over keys for decode (1 query), prefill and the trainer's forward.

    attention(q [B, H, S_q, D], k_buf / v_buf [B, H_kv, S_k, D], key_valid [B, >= S_k], q_start, sm_scale,
              k_scale=None, v_scale=None) -> [B, H, S_q, D]

Query s of row b sits at cache column `q_start + s` (q_start: int, or an int64 tensor, 0-dim or [B]); it attends to
the keys at columns <= its own whose `key_valid` is set (causal AND not padding). K/V may be stored as e4m3 with
per-layer scales (the FP8 cache), read as `kv_dequant` reads them: equal to the trainer's fake-quantized K/V.

On CUDA (`batch_invariant_kernels._attention_kernel`) a program takes a tile of query rows (positions x the query
heads of one KV head: 64 for prefill and training, 16 for a decode step) and runs an online softmax over keys in
blocks of 64 aligned to the row's first valid key; the keys are the MMA's rows (scores and output computed
transposed), so every score and output element is reduced in one order whatever the tile's width. A block a query
may not see leaves its running max, sum and output bit for bit unchanged, so a query's result does not depend on how
many other queries share its program or how far the loop runs: decode, prefill and training give the same bits for
the same query. The online softmax restarts at every chunk of `ATTN_SPLIT_KEYS` keys (from the row's first valid
key) and the chunks are merged in order with separately rounded products: the trainer's and the prefill's programs
merge as they go, a decode step runs one program a chunk and merges after (flash decoding), with the same bits.
Elsewhere the twin runs (`attention_ref`): float64 scores and weights from elementwise products and innermost-dim
sums (batch-invariant on CPU), rounded once. The trainer's forward (`batch_invariant_train`: padded rows and packed
rows) writes each query's log-sum-exp too and takes its gradient from flash attention's backward over that output
(the forward bits are what must match the rollout; gradients need not).

Paged decode (`paged_attention`, continuous batching): one query per row over keys [0, kv_len) of the row, read
through a block table from one layer's block pools (key j: block table[b, j // page], slot j % page). A row there
has no left padding, so its first valid key is column 0: the CUDA kernel is `attention`'s with the addresses
looked up in the table (no gather copy), the same key blocks relative to the first key, hence the same bits as the
left-padded contiguous cache's decode step for the same keys; the twin gathers the row's blocks and runs
`attention_ref`.
"""

from __future__ import annotations

import torch

from nemo_jetrl.precision.kv import kv_dequant

FP8 = torch.float8_e4m3fn
REF_QUERY_CHUNK = 16  # queries per step of the float64 twin (bounds its [B, H, chunk, S_k, D] products)


def attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    key_valid: torch.Tensor,
    q_start: int | torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batch-invariant attention (module docstring); no autograd. Returns [B, H, S_q, D] in q.dtype."""
    _check(q, k_buf, v_buf, key_valid, k_scale, v_scale)
    if not q.is_cuda:
        return attention_ref(q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale, v_scale)
    from nemo_jetrl.models import batch_invariant_kernels, exact_cuda_choice

    start = q_start if isinstance(q_start, torch.Tensor) else torch.tensor(q_start, device=q.device)
    if start.dtype != torch.int64 or start.shape not in ((), (q.shape[0],)):
        raise ValueError(f"batch-invariant attention: q_start must be int64 of shape () or [B], got {start.shape}")
    if exact_cuda_choice.takes_cuda(q, k_buf, v_buf, key_valid, paged=False):  # a decode step, the same bits
        return exact_cuda_choice.decode_step(q, k_buf, v_buf, key_valid, start, sm_scale, k_scale, v_scale)
    return batch_invariant_kernels.attention(q, k_buf, v_buf, key_valid, start, sm_scale, k_scale, v_scale)


def attention_ref(
    q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale=None, v_scale=None, with_lse: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The float64 twin of `attention` (same arguments and result layout); with_lse: also each query's natural-log
    sum of exp(scores) [B, H, S_q] float32 (+inf where it sees no key), as the kernel writes it."""
    bsz, heads, s_q, _ = q.shape
    s_k = k_buf.shape[2]
    k, v = k_buf, v_buf
    if k.dtype == FP8:
        k, v = kv_dequant(k, k_scale, q.dtype), kv_dequant(v, v_scale, q.dtype)
    n_rep = heads // k.shape[1]
    k = k.to(q.dtype).double().repeat_interleave(n_rep, dim=1)  # [B, H, S_k, D]
    vt = v.to(q.dtype).double().repeat_interleave(n_rep, dim=1).transpose(-1, -2)  # [B, H, D, S_k]
    start = torch.as_tensor(q_start, device=q.device).reshape(-1, 1)  # [1 | B, 1]
    k_col = torch.arange(s_k, device=q.device)
    out, lse = [], []
    for lo in range(0, s_q, REF_QUERY_CHUNK):
        qc = q[:, :, lo : lo + REF_QUERY_CHUNK].double()  # [B, H, c, D]
        q_col = start + torch.arange(lo, lo + qc.shape[2], device=q.device)  # [1 | B, c]
        allowed = key_valid[:, None, :s_k].bool() & (k_col <= q_col[..., None])  # [B, c, S_k]
        scores = (qc[:, :, :, None, :] * k[:, :, None, :, :]).sum(-1) * sm_scale  # [B, H, c, S_k]
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        top = scores.amax(-1, keepdim=True).nan_to_num(neginf=0.0)  # rows that may see no key: 0
        weights = (scores - top).exp()  # [B, H, c, S_k]
        num = (weights[:, :, :, None, :] * vt[:, :, None, :, :]).sum(-1)  # [B, H, c, D]
        total = weights.sum(-1, keepdim=True)  # [B, H, c, 1]
        out.append(num / total.clamp_min(1e-300))
        lse.append(torch.where(total > 0, top + total.log(), float("inf"))[..., 0])  # [B, H, c]
    result = torch.cat(out, dim=2).to(q.dtype)
    return (result, torch.cat(lse, dim=2).float()) if with_lse else result


def paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    kv_len: torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batch-invariant decode attention over a paged KV pool (module docstring): q [B, H, 1, D]; k_pool / v_pool
    [num_blocks, H_kv, page, D] (bf16/fp32, or e4m3 with 0-dim k_scale / v_scale); block_table int32 [B, max_blocks];
    kv_len int64 [B] in [1, max_blocks * page] (the query sits at column kv_len - 1). Returns [B, H, 1, D] in q.dtype."""
    _check_paged(q, k_pool, v_pool, block_table, kv_len, k_scale, v_scale)
    if not q.is_cuda:
        return paged_attention_ref(q, k_pool, v_pool, block_table, kv_len, sm_scale, k_scale, v_scale)
    from nemo_jetrl.models import batch_invariant_kernels, exact_cuda_choice

    if exact_cuda_choice.takes_cuda(q, k_pool, v_pool, None, paged=True):  # the same bits (exact_decode_cuda)
        return exact_cuda_choice.decode_step(q, k_pool, v_pool, None, kv_len - 1, sm_scale, k_scale, v_scale,
                                               block_table)  # fmt: skip
    return batch_invariant_kernels.paged_attention(q, k_pool, v_pool, block_table, kv_len, sm_scale, k_scale, v_scale)


def paged_attention_ref(q, k_pool, v_pool, block_table, kv_len, sm_scale, k_scale=None, v_scale=None) -> torch.Tensor:
    """The twin of `paged_attention` (same arguments): each row's blocks gathered into columns [0, W) of a contiguous
    buffer (W: the longest row's key count), then `attention_ref` with keys [0, kv_len[b]) valid."""
    page = k_pool.shape[2]
    width = int(kv_len.max())
    table = block_table[:, : -(-width // page)].long()  # [B, n] the blocks holding keys [0, W)
    k_buf, v_buf = (gather_pages(pool, table)[:, :, :width] for pool in (k_pool, v_pool))  # [B, H_kv, W, D]
    key_valid = torch.arange(width, device=q.device) < kv_len[:, None]  # [B, W]
    return attention_ref(q, k_buf, v_buf, key_valid, kv_len - 1, sm_scale, k_scale, v_scale)


def gather_pages(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """One layer's pool [num_blocks, H_kv, page, D] read through table [B, n] -> [B, H_kv, n * page, D] (stored
    dtype; the twins' gather of a paged KV pool)."""
    raw = pool.view(torch.uint8) if pool.dtype == FP8 else pool  # CPU indexing has no e4m3 kernel everywhere
    blocks = raw[table.long()]  # [B, n, H_kv, page, D]
    bsz, nblk, heads, page, dim = blocks.shape
    out = blocks.permute(0, 2, 1, 3, 4).reshape(bsz, heads, nblk * page, dim)
    return out.view(FP8) if pool.dtype == FP8 else out


def decoder_attention(q, k, v, key_valid, kv_cache, layer_idx: int, cache_start, sm_scale: float) -> torch.Tensor:
    """`decoder_forward`'s attention in the exact mode over the rollout's cache: q [B, H, S, D] after writing k/v
    [B, H_kv, S, D] at `cache_start` (an FP8 cache is read as stored; a paged cache serves the step itself,
    `paged_attention`). key_valid: [B, S_total] bool. Returns [B, H, S, D]. (The trainer's: `batch_invariant_train`.)"""
    if kv_cache.is_paged:  # continuous batching: one query per row at its own column, keys through the table
        return kv_cache.exact_decode_attention(layer_idx, q, k, v, cache_start, sm_scale)
    kv_cache.write(layer_idx, k, v, cache_start)
    k_scale, v_scale = kv_cache.layer_scales(layer_idx)
    width = key_valid.shape[1]  # S_total columns the queries may see
    k_buf, v_buf = kv_cache.k[layer_idx][:, :, :width], kv_cache.v[layer_idx][:, :, :width]  # [B, H_kv, S_total, D]
    return attention(q, k_buf, v_buf, key_valid, cache_start, sm_scale, k_scale, v_scale)


def _check_paged(q, k_pool, v_pool, block_table, kv_len, k_scale, v_scale) -> None:
    bsz, _, s_q, dim = q.shape
    if s_q != 1 or k_pool.dim() != 4 or k_pool.shape != v_pool.shape or k_pool.shape[-1] != dim:
        raise ValueError(
            f"batch-invariant paged attention: one query per row over [blocks, H_kv, page, D] pools, got q "
            f"{tuple(q.shape)} and pools {tuple(k_pool.shape)}"
        )
    if block_table.dtype != torch.int32 or block_table.shape[0] != bsz or block_table.stride(-1) != 1:
        raise ValueError(f"batch-invariant paged attention: block_table must be int32 [B={bsz}, max_blocks]")
    if kv_len.dtype != torch.int64 or kv_len.shape != (bsz,):
        raise ValueError(f"batch-invariant paged attention: kv_len must be int64 [B={bsz}], got {kv_len.shape}")
    _check_heads_and_scales(q, k_pool, v_pool, k_scale, v_scale)


def _check_heads_and_scales(q, k_buf, v_buf, k_scale, v_scale) -> None:
    heads, dim = q.shape[1], q.shape[-1]
    if heads % k_buf.shape[1] or dim & (dim - 1) or dim < 16:
        raise ValueError(f"batch-invariant attention: heads {heads} / {k_buf.shape[1]}, head_dim {dim} (power of 2)")
    if (k_buf.dtype == FP8) != (k_scale is not None and v_scale is not None):
        raise ValueError("batch-invariant attention: an e4m3 cache needs k_scale and v_scale (and only it)")
    if q.stride(-1) != 1 or k_buf.stride(-1) != 1 or v_buf.stride(-1) != 1:
        raise ValueError("batch-invariant attention: the head dim of q, k and v must be contiguous")


def _check(q, k_buf, v_buf, key_valid, k_scale, v_scale) -> None:
    bsz, dim = q.shape[0], q.shape[-1]
    if k_buf.dim() != 4 or k_buf.shape != v_buf.shape or k_buf.shape[0] != bsz or k_buf.shape[-1] != dim:
        raise ValueError(f"batch-invariant attention: q {tuple(q.shape)} does not fit k/v {tuple(k_buf.shape)}")
    if key_valid.dim() != 2 or key_valid.shape[0] != bsz or key_valid.shape[1] < k_buf.shape[2]:
        raise ValueError(f"batch-invariant attention: key_valid must be [B, >= {k_buf.shape[2]}]")
    _check_heads_and_scales(q, k_buf, v_buf, k_scale, v_scale)
