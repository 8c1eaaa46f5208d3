"""Paged KV cache: K/V in fixed-size blocks of a shared pool, one block table row per decode-batch row.

Pools are [L, num_blocks, H_kv, page, D] (bf16, or e4m3 with one FP32 dequantization scale per layer, as
`KVCache`); `table` int32 [rows, max_blocks] maps row b's token j to block table[b, j // page], offset j % page.
Block 0 is the trash block: a row that is not running points every entry there, so its pad token writes and reads
nothing another sequence owns. Which blocks a row holds is the host's business (`block_scheduler.py`); the rollout
copies the table to the device at each sync.

Decode step (one token per row, row b at its own column start[b]):
- CUDA (`fused_decode`): `write_decode_kv` stores the new K/V through the table and `decode_attention` reads the
  pools through it, in place (Triton; the e4m3 pool through the CUDA kernel where it fits);
- elsewhere (the twin): `paged_write_ref` writes through the table and each row's SDPA reads its own keys,
  gathered and dequantized (`paged_decode_attention_ref` is the attention kernel's twin for the parity tests).
The exact mode and matched kernels (`exact_decode_attention`): the same write, then the batch-invariant attention
read through the table (`batch_invariant_attention.paged_attention`: in place on CUDA, gathered by its twin
elsewhere), bitwise the one-batch path's decode step over the same keys.
Prefill goes into a contiguous scratch `KVCache` whose K/V `write_blocks` copies into a sequence's blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nemo_jetrl.generation.native.decode_attention import decode_attention, decode_attention_ref, write_decode_kv
from nemo_jetrl.generation.native.kv_cache import FP8_KV_DTYPE, KVCache, LayerKvScales, encode_kv, model_head_dim
from nemo_jetrl.models.batch_invariant_attention import gather_pages, paged_attention
from nemo_jetrl.models.sdpa import sdpa


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    kv_len: torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Twin of `decode_attention(..., block_table=table)`: q [B, H, D], pools [blocks, H_kv, page, D], kv_len [B]
    (keys [0, kv_len[b]) of row b). Returns [B, H, D] in q.dtype."""
    k, v = gather_pages(k_pool, table), gather_pages(v_pool, table)  # [B, H_kv, S, D]
    valid = torch.arange(k.shape[2], device=q.device) < kv_len.reshape(-1, 1).to(q.device)  # [B, S]
    return decode_attention_ref(q, k, v, valid, k.shape[2], sm_scale, k_scale, v_scale)


def paged_write_ref(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_len: torch.Tensor,
    table: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Twin of `write_decode_kv(..., block_table=table)`: k/v [B, H_kv, 1, D] stored at position kv_len[b] - 1 of
    each row (FP8 pools: `kv_quant` with the layer's scale)."""
    page = k_pool.shape[2]
    pos = kv_len.reshape(-1).long() - 1  # [B]
    rows = torch.arange(k.shape[0], device=k.device)
    blocks, offsets = table.long()[rows, pos // page], pos % page  # [B] each
    for pool, value, scale in ((k_pool, k, k_scale), (v_pool, v, v_scale)):
        encoded = encode_kv(value[:, :, 0], pool.dtype, scale)  # [B, H_kv, D]
        if pool.dtype == FP8_KV_DTYPE:
            pool, encoded = pool.view(torch.uint8), encoded.view(torch.uint8)
        pool[blocks, :, offsets] = encoded


class PagedKVCache(LayerKvScales):
    """Block pools of `num_layers` layers and the block table of `rows` decode-batch rows (module docstring)."""

    is_paged = True  # the exact mode's decode step goes through `exact_decode_attention`

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        num_kv_heads: int,
        block_size: int,
        head_dim: int,
        rows: int,
        max_blocks_per_seq: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        fused_decode: bool = False,
    ) -> None:
        dims = (num_layers, num_blocks, num_kv_heads, block_size, head_dim, rows, max_blocks_per_seq)
        if min(dims) < 1 or num_blocks < 2:
            raise ValueError(f"PagedKVCache dimensions must be positive (>= 2 blocks), got {dims}")
        self.num_layers, self.block_size, self.dtype = num_layers, block_size, dtype
        self.max_seq_len = max_blocks_per_seq * block_size  # keys a row's table can address
        shape = (num_layers, num_blocks, num_kv_heads, block_size, head_dim)
        # zero-filled: the trash block and unwritten offsets enter masked sums as 0 * value, never NaN
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, blocks, H_kv, page, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, blocks, H_kv, page, D]
        self.table = torch.zeros((rows, max_blocks_per_seq), dtype=torch.int32, device=self.k.device)  # [rows, M]
        self.k_scales: torch.Tensor | None = None  # [L] fp32, FP8 only
        self.v_scales: torch.Tensor | None = None
        self.fused_decode = bool(fused_decode)

    @classmethod
    def for_model(cls, model: nn.Module, num_blocks: int, block_size: int, rows: int, max_blocks: int, **kw):
        cfg = model.config
        head_dim = model_head_dim(cfg)
        return cls(
            cfg.num_hidden_layers, num_blocks, cfg.num_key_value_heads, block_size, head_dim, rows, max_blocks, **kw
        )

    def write_blocks(self, blocks: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy k, v [L, H_kv, n, D] (stored dtype, e.g. a scratch prefill cache's) into `blocks` from their first
        offset on: token i goes to blocks[i // page], offset i % page."""
        page, n = self.block_size, k.shape[2]
        nblk = -(-n // page)
        if nblk > len(blocks) or k.shape != v.shape or k.dtype != self.dtype:
            raise ValueError(f"write_blocks: {n} tokens of {k.dtype} do not fit {len(blocks)} blocks of {self.dtype}")
        idx = torch.tensor(blocks[:nblk], dtype=torch.long, device=self.k.device)
        for pool, value in ((self.k, k), (self.v, v)):
            if pool.dtype == FP8_KV_DTYPE:
                pool, value = pool.view(torch.uint8), value.view(torch.uint8)
            layers, heads, _, dim = value.shape
            padded = F.pad(value, (0, 0, 0, nblk * page - n))  # [L, H_kv, nblk * page, D]
            pool[:, idx] = padded.view(layers, heads, nblk, page, dim).transpose(1, 2)  # [L, nblk, H_kv, page, D]

    def copy_block(self, src: int, dst: int) -> None:
        """Block dst of every layer := block src (a group member's copy of its owner's partial prompt block)."""
        for pool in (self.k, self.v):
            view = pool.view(torch.uint8) if pool.dtype == FP8_KV_DTYPE else pool
            view[:, dst].copy_(view[:, src])

    # ------------------------------------------------------------------ the decoder's cache interface
    def uses_fused_decode(self, q: torch.Tensor) -> bool:
        """Every decode step goes through `decode_attention` (kernels on CUDA, the twin elsewhere)."""
        return q.shape[2] == 1

    def decode_attention(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        start: torch.Tensor,
        mask: torch.Tensor,
        sm_scale: float,
    ) -> torch.Tensor:
        """Write k, v [B, H_kv, 1, D] at columns start [B] through the table, attend q [B, H, 1, D] over keys
        [0, start] of each row (`mask` unused: a row's keys are its own blocks). Returns [B, H, 1, D] in q.dtype."""
        kv_len, table = self._write(layer, q, k, v, start)
        if not (self.fused_decode and q.dtype in (torch.bfloat16, torch.float32)):
            return self._rowwise_sdpa(layer, q, kv_len.tolist(), sm_scale)
        k_scale, v_scale = self.layer_scales(layer)
        out = decode_attention(
            q[:, :, 0], self.k[layer], self.v[layer], None, kv_len, sm_scale, k_scale, v_scale, block_table=table
        )  # [B, H, D]
        return out[:, :, None]

    def exact_decode_attention(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor, sm_scale: float
    ) -> torch.Tensor:
        """The exact mode's decode step: write k, v [B, H_kv, 1, D] at columns start [B] through the table (as
        `decode_attention`), attend q [B, H, 1, D] over keys [0, start] of each row with the batch-invariant kernel
        read through the table. Returns [B, H, 1, D] in q.dtype."""
        kv_len, table = self._write(layer, q, k, v, start)
        return paged_attention(q, self.k[layer], self.v[layer], table, kv_len, sm_scale, *self.layer_scales(layer))

    def _write(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor):
        """Store the step's k, v [B, H_kv, 1, D] at columns start [B] (one kernel on CUDA, its bitwise twin
        elsewhere); returns (kv_len [B], the rows' block table [B, max_blocks])."""
        if not isinstance(start, torch.Tensor) or start.shape != (q.shape[0],) or k.shape[2] != 1:
            raise ValueError(f"PagedKVCache takes one token per row at per-row columns, got k {tuple(k.shape)}")
        k_scale, v_scale = self.layer_scales(layer)
        table = self.table[: q.shape[0]]
        kv_len = start + 1  # [B]
        if self.fused_decode and q.dtype in (torch.bfloat16, torch.float32):
            write_decode_kv(self.k[layer], self.v[layer], k, v, kv_len, k_scale, v_scale, block_table=table)
        else:
            paged_write_ref(self.k[layer], self.v[layer], k, v, kv_len, table, k_scale, v_scale)
        return kv_len, table

    def _rowwise_sdpa(self, layer: int, q: torch.Tensor, kv_lens: list[int], sm_scale: float) -> torch.Tensor:
        """The twin path: each row's SDPA over exactly its own keys, as the one-batch path's masked SDPA computes a
        row (CPU SDPA rounds alike for every key count within a size class, so rows stay batch-invariant)."""
        k_scale, v_scale = self.layer_scales(layer)
        out = torch.empty_like(q)  # [B, H, 1, D]
        for b, n in enumerate(kv_lens):
            read = self.table[b : b + 1, : -(-n // self.block_size)]  # [1, blocks holding keys [0, n)]
            keys = KVCache._decode(gather_pages(self.k[layer], read)[:, :, :n], k_scale, q.dtype)  # [1, H_kv, n, D]
            values = KVCache._decode(gather_pages(self.v[layer], read)[:, :, :n], v_scale, q.dtype)
            n_rep = q.shape[1] // keys.shape[1]
            keys, values = keys.repeat_interleave(n_rep, 1), values.repeat_interleave(n_rep, 1)  # [1, H, n, D]
            allowed = torch.ones((1, 1, 1, n), dtype=torch.bool, device=q.device)
            out[b : b + 1] = sdpa(q[b : b + 1], keys, values, attn_mask=allowed, scale=sm_scale)
        return out
