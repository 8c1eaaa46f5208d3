"""KV memory budget and slot scheduling for continuous batching (host-side bookkeeping, no tensors).

The KV cache is `num_slots` slots of `slot_tokens` columns each; a slot holds one sequence from its prompt to its
last token, so a sequence admitted into a free slot can always run to its length cap: nothing is ever preempted,
and a budget that cannot hold one sequence is an error before any work. The price of reserving the worst case is
concurrency: a slot costs `slot_tokens` columns whatever the response length (a paged cache would admit by actual
use). `plan_kv_budget` sizes the slots from a byte budget and a `max_num_seqs`-like cap; `SlotScheduler` admits
queued requests into free slots in queue order and refills slots as their sequences finish.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from nemo_jetrl.generation.native.kv_cache import KVCache

GIB = 1024**3


@dataclass(frozen=True)
class KvBudget:
    """num_slots concurrent sequences of up to slot_tokens tokens, bytes_per_token over all layers (K and V)."""

    num_slots: int
    slot_tokens: int
    bytes_per_token: int

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.slot_tokens * self.bytes_per_token


def plan_kv_budget(
    *,
    num_sequences: int,
    slot_tokens: int,
    bytes_per_token: int,
    max_num_seqs: int | None = None,
    budget_bytes: int | None = None,
    budget_source: str = "the KV budget",
) -> KvBudget:
    """Slots for `num_sequences` sequences: min(num_sequences, max_num_seqs, budget_bytes // slot bytes).

    budget_source names the setting the budget came from, for the error when not even one sequence fits."""
    if num_sequences < 1 or slot_tokens < 1 or bytes_per_token < 1:
        raise ValueError(
            f"plan_kv_budget: num_sequences, slot_tokens and bytes_per_token must be >= 1, got "
            f"{num_sequences}, {slot_tokens}, {bytes_per_token}"
        )
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    slots = num_sequences if max_num_seqs is None else min(num_sequences, max_num_seqs)
    if budget_bytes is not None:
        slot_bytes = slot_tokens * bytes_per_token
        if budget_bytes < slot_bytes:
            raise ValueError(
                f"{budget_source} leaves {budget_bytes / GIB:.3f} GiB for the KV cache; one sequence of "
                f"{slot_tokens} tokens needs {slot_bytes / GIB:.3f} GiB ({bytes_per_token} bytes per token): raise "
                "the budget or lower max_model_len / the length caps"
            )
        slots = min(slots, budget_bytes // slot_bytes)
    return KvBudget(int(slots), int(slot_tokens), int(bytes_per_token))


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
    """Slots for one `generate` call of a NativeGenerationEngine: its max_num_seqs and KV byte budget
    (kv_cache_memory_bytes, else gpu_memory_utilization on CUDA), slots as long as the longest row's cap."""
    slot_tokens = max(len(p) + c for p, c in zip(prompt_ids, caps))
    budget, source = engine.kv_cache_memory_bytes, "kv_cache_memory_bytes"
    if budget is None and engine.gpu_memory_utilization is not None and engine.device.type == "cuda":
        upper = len(prompt_ids) if engine.max_num_seqs is None else min(len(prompt_ids), engine.max_num_seqs)
        reserve = 3 * upper * engine.vocab_size * 8 + GIB  # sampling buffers [B, V] + prefill activations
        budget = gpu_kv_budget_bytes(engine.device, engine.gpu_memory_utilization, reserve)
        source = f"gpu_memory_utilization={engine.gpu_memory_utilization}"
    return plan_kv_budget(
        num_sequences=len(prompt_ids),
        slot_tokens=slot_tokens,
        bytes_per_token=KVCache.token_bytes(engine.model, engine.kv_cache_dtype),
        max_num_seqs=engine.max_num_seqs,
        budget_bytes=budget,
        budget_source=source,
    )


def engine_budget_kwargs(gen: dict) -> dict:
    """The NativeGenerationEngine keyword arguments of a validated `policy.generation` section's KV budget."""
    keys = ("max_num_seqs", "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len")
    return {key: gen.get(key) for key in keys}


class SlotScheduler:
    """Requests 0..num_requests-1 waiting in order; `admit()` fills free slots, `release(slots)` frees them."""

    def __init__(self, num_requests: int, num_slots: int) -> None:
        if num_requests < 1 or num_slots < 1:
            raise ValueError(f"SlotScheduler needs >= 1 request and slot, got {num_requests}, {num_slots}")
        self.waiting: deque[int] = deque(range(num_requests))
        self.slot_request: list[int | None] = [None] * num_slots
        self.admissions = 0  # admission rounds (prefills)
        self.peak_live = 0

    @property
    def num_live(self) -> int:
        return sum(r is not None for r in self.slot_request)

    @property
    def done(self) -> bool:
        return not self.waiting and self.num_live == 0

    def admit(self) -> list[tuple[int, int]]:
        """(slot, request) pairs newly admitted into free slots, in slot order; [] when none is free or waiting."""
        pairs = []
        for slot, request in enumerate(self.slot_request):
            if request is None and self.waiting:
                pairs.append((slot, self.waiting.popleft()))
                self.slot_request[slot] = pairs[-1][1]
        if pairs:
            self.admissions += 1
            self.peak_live = max(self.peak_live, self.num_live)
        return pairs

    def release(self, slots: list[int]) -> list[int]:
        """Free `slots` (their sequences finished); returns the requests they held."""
        requests = []
        for slot in slots:
            request = self.slot_request[slot]
            if request is None:
                raise ValueError(f"slot {slot} is already free")
            requests.append(request)
            self.slot_request[slot] = None
        return requests
