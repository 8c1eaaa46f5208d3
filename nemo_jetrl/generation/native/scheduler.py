"""KV memory budget for continuous batching over a paged KV cache (host-side arithmetic, no tensors).

The KV cache is a pool of `num_blocks` blocks of `block_size` tokens (`paged_kv_cache.py`); a sequence takes
blocks as it grows, so concurrency follows real lengths, not length caps, and a pool that runs dry mid-generation
preempts (`block_scheduler.py`). `plan_kv_budget` sizes the pool from a byte budget (or, without one, so that
`max_num_seqs` sequences fit at their caps: nothing is ever preempted) and the number of batch rows from
`max_num_seqs`; a budget that cannot hold the longest sequence alone is an error before any work.

Block size: 16 tokens by default (vLLM's default too). The CUDA e4m3 decode kernel reads 16-key tiles, so a page
must be a multiple of 16; a smaller page wastes less (half a page per sequence on average, and each GRPO member
copies its prompt's last partial page) and a larger one only saves table lookups, which cost little next to the
K/V bytes of a page (16 keys x 128 dims x 2 bytes per KV head in BF16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nemo_jetrl.generation.native.kv_cache import KVCache

GIB = 1024**3
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class KvBudget:
    """num_rows sequences decoded at once at most, over num_blocks blocks of block_size tokens (block 0 is the
    pool's trash block); a row's block table has max_blocks_per_seq entries; whole_batch: every sequence fits at
    its cap at once (the static one-batch path serves the call)."""

    num_rows: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int
    bytes_per_token: int
    whole_batch: bool

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_size * self.bytes_per_token


def plan_kv_budget(
    *,
    seq_tokens: list[int],
    bytes_per_token: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_seqs: int | None = None,
    budget_bytes: int | None = None,
    budget_source: str = "the KV budget",
) -> KvBudget:
    """A block pool for sequences of at most seq_tokens[i] tokens each (prompt + response cap).

    budget_source names the setting the budget came from, for the error when not even one sequence fits."""
    if not seq_tokens or min(seq_tokens) < 1 or bytes_per_token < 1 or block_size < 1:
        raise ValueError(
            f"plan_kv_budget: needs sequences of >= 1 token, bytes_per_token and block_size >= 1, got "
            f"{len(seq_tokens)} sequences, {bytes_per_token}, {block_size}"
        )
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    n, longest = len(seq_tokens), max(seq_tokens)
    rows = n if max_num_seqs is None else min(n, max_num_seqs)
    per_seq = [-(-t // block_size) for t in seq_tokens]  # blocks
    widest = max(per_seq)
    everything = 1 + sum(per_seq)  # more blocks than the whole batch holds at its caps are never used
    if budget_bytes is None:
        blocks = min(everything, 1 + rows * widest)
    else:
        block_bytes = block_size * bytes_per_token
        if budget_bytes < (1 + widest) * block_bytes:
            raise ValueError(
                f"{budget_source} leaves {budget_bytes / GIB:.3f} GiB for the KV cache; one sequence of "
                f"{longest} tokens needs {widest * block_bytes / GIB:.3f} GiB ({widest} blocks of {block_size} "
                f"tokens, {bytes_per_token} bytes per token): raise the budget or lower max_model_len / the "
                "length caps"
            )
        blocks = min(everything, budget_bytes // block_bytes)
    rows = min(rows, blocks - 1)  # a sequence holds at least one block
    whole = rows == n and (budget_bytes is None or n * longest * bytes_per_token <= budget_bytes)
    return KvBudget(int(rows), int(blocks), int(block_size), int(widest), int(bytes_per_token), whole)


def gpu_kv_budget_bytes(device: torch.device, gpu_memory_utilization: float, reserve_bytes: int = 0) -> int:
    """Bytes the KV cache may take on `device`: the fraction `gpu_memory_utilization` of the memory the process
    does not hold now (the colocated trainer's weights, optimizer state and FP8 weight caches stay resident while
    the rollout runs), minus `reserve_bytes` for the rollout's own activations. May be <= 0 (then
    `plan_kv_budget` names the setting)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    total = torch.cuda.get_device_properties(device).total_memory
    free = total - torch.cuda.memory_allocated(device)
    return int(gpu_memory_utilization * free) - int(reserve_bytes)


def engine_kv_budget(engine, prompt_ids: list[list[int]], caps: list[int]) -> KvBudget:
    """The block pool of one `generate` call of a NativeGenerationEngine: its max_num_seqs, kv_block_size and KV
    byte budget (kv_cache_memory_bytes, else gpu_memory_utilization on CUDA)."""
    budget, source = engine.kv_cache_memory_bytes, "kv_cache_memory_bytes"
    if budget is None and engine.gpu_memory_utilization is not None and engine.device.type == "cuda":
        upper = len(prompt_ids) if engine.max_num_seqs is None else min(len(prompt_ids), engine.max_num_seqs)
        reserve = 3 * upper * engine.vocab_size * 8 + GIB  # sampling buffers [B, V] + prefill activations
        budget = gpu_kv_budget_bytes(engine.device, engine.gpu_memory_utilization, reserve)
        source = f"gpu_memory_utilization={engine.gpu_memory_utilization}"
    return plan_kv_budget(
        seq_tokens=[len(p) + c for p, c in zip(prompt_ids, caps)],
        bytes_per_token=KVCache.token_bytes(engine.model, engine.kv_cache_dtype),
        block_size=engine.kv_block_size,
        max_num_seqs=engine.max_num_seqs,
        budget_bytes=budget,
        budget_source=source,
    )


def engine_budget_kwargs(gen: Any) -> dict:
    """The NativeGenerationEngine keyword arguments of a validated `policy.generation` section's KV budget (a
    `GenerationConfig`)."""
    keys = ("max_num_seqs", "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len", "kv_block_size")
    return {key: getattr(gen, key) for key in keys}
