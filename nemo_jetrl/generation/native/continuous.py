"""Continuous batching for the native engine: a queue of sequences over a fixed number of KV slots.

Each slot holds one sequence in cache columns [0, prompt + response); rows write their new token at their own
column (`KVCache.update` / `decode_attention` with per-row starts) and the decode attention reads each row's own
keys only. Every `sync_every` decode steps the host looks at which rows finished, frees their slots and admits
waiting sequences: their prompts are prefilled (a prompt repeated in the admitted set, a GRPO group, is prefilled
once and its KV copied into each member's slot) and their first tokens are sampled with the next step. Finished
rows that wait for the next check decode a pad token over one key (cheap), never over their whole history.

Sampling streams are per sequence (`sampler.sequence_keys` of the request index, draw index = token index), so a
sequence's tokens do not depend on the batch around it or on when it was admitted, as far as its logits do not
(CPU: equal greedy and sampled tokens with and without continuous batching; see docs/performance.md for the GPU).
The output is the engine's shared layout (prompts left-padded to the longest, responses from column P).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_jetrl.generation.interfaces import GenerationOutput
from nemo_jetrl.generation.native.cuda_graph import CapturedStep
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.generation.native.sampler import sample, seed_of, sequence_keys
from nemo_jetrl.generation.native.scheduler import KvBudget, SlotScheduler


@dataclass
class RolloutStats:
    """What one continuous-batching rollout did (`engine.last_rollout_stats`)."""

    num_sequences: int = 0
    num_slots: int = 0
    slot_tokens: int = 0
    kv_cache_bytes: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    slot_steps_live: int = 0  # sum over decode steps of the rows holding a running sequence
    admissions: int = 0
    peak_live: int = 0
    prefill_tokens: int = 0  # prompt tokens run through the model (padding excluded)
    prefill_tokens_shared: int = 0  # prompt tokens copied from a group member's prefill instead of recomputed

    @property
    def occupancy(self) -> float:
        """Mean fraction of slots holding a running sequence per decode step."""
        return self.slot_steps_live / max(1, self.decode_steps * self.num_slots)


class ContinuousRollout:
    """One `generate` call of `engine` (a NativeGenerationEngine) over `budget.num_slots` slots."""

    def __init__(self, engine, prompt_ids: list[list[int]], budget: KvBudget, caps: list[int]) -> None:
        self.engine, self.prompts, self.caps = engine, prompt_ids, caps
        dev, slots, width = engine.device, budget.num_slots, budget.slot_tokens
        self.cache: KVCache = engine._new_cache(slots, width)
        self.mask = torch.zeros((slots, width), dtype=torch.long, device=dev)  # [B, S] keys each row may see
        # [B] next cache column of each row = its next position id (a slot holds its sequence from column 0)
        self.cols = torch.zeros(slots, dtype=torch.long, device=dev)
        self.requests = torch.zeros(slots, dtype=torch.long, device=dev)  # [B] request in each slot
        self.counts = torch.zeros(slots, dtype=torch.long, device=dev)  # [B] tokens generated so far
        self.limits = torch.zeros(slots, dtype=torch.long, device=dev)  # [B] length cap of each row's response
        self.running = torch.zeros(slots, dtype=torch.bool, device=dev)  # [B]
        self.logits: torch.Tensor | None = None  # [B, V] next-token logits of each row
        n, t = len(prompt_ids), max(caps)
        self.tokens_out = torch.full((n + 1, t), engine.pad_token_id, dtype=torch.long, device=dev)  # row n: trash
        self.logprobs_out = torch.zeros((n + 1, t), dtype=torch.float32, device=dev)  # [N + 1, T]
        self.lengths_out = torch.zeros(n + 1, dtype=torch.long, device=dev)  # [N + 1]
        self.finished_out = torch.zeros(n + 1, dtype=torch.bool, device=dev)  # [N + 1]
        self.scheduler = SlotScheduler(n, slots)
        self.stats = RolloutStats(n, slots, width, self.cache.nbytes)
        self._graph: CapturedStep | None = None

    # ------------------------------------------------------------------ the loop
    def run(self, greedy: bool, generator: torch.Generator | None) -> GenerationOutput:
        eng = self.engine
        keys_all = sequence_keys(seed_of(generator), torch.arange(len(self.prompts), device=eng.device))  # [N]
        stop_ids = torch.tensor(eng.stop_token_ids, dtype=torch.long, device=eng.device)
        trash = len(self.prompts)
        self.hook = eng.attn_hook_factory() if eng.attn_hook_factory is not None else None
        live_steps = torch.zeros((), dtype=torch.long, device=eng.device)
        self._admit()
        step = 0
        while True:
            live = self.running  # [B] rows whose token this step is real
            tokens, logprobs = sample(
                self.logits, eng.sampling, greedy=greedy, keys=keys_all[self.requests], counters=self.counts,
                batch_invariant=eng.batch_invariant,
            )  # [B] each  # fmt: skip
            rows = torch.where(live, self.requests, trash)  # finished / free rows write the trash row
            cols = torch.where(live, self.counts, 0)
            self.tokens_out.index_put_((rows, cols), tokens)
            self.logprobs_out.index_put_((rows, cols), logprobs)
            stopped = live & torch.isin(tokens, stop_ids)
            self.counts += live.long()
            self.lengths_out.index_put_((rows,), self.counts)
            self.finished_out.index_put_((rows,), stopped)
            self.running = live & ~stopped & (self.counts < self.limits)
            live_steps += live.sum()
            step += 1
            self._decode(torch.where(live, tokens, eng.pad_token_id), live)
            if step % eng.sync_every == 0 and self._refill():
                break
        self.stats.decode_steps = step
        self.stats.slot_steps_live = int(live_steps)
        return self._output()

    def _refill(self) -> bool:
        """Free finished slots, admit waiting sequences (their prompt logits replace the rows' decode logits);
        True when nothing is left to run."""
        running = self.running.tolist()
        finished = [s for s, r in enumerate(self.scheduler.slot_request) if r is not None and not running[s]]
        if finished:
            self.scheduler.release(finished)
        if self.scheduler.done:
            return True
        self._admit()
        return False

    def _decode(self, tokens: torch.Tensor, live: torch.Tensor) -> None:
        """Feed each row's token [B] at its column; rows not live decode a pad over one key at column 0."""
        cols = torch.where(live, self.cols, 0)  # [B]
        self.mask.scatter_(1, cols[:, None], 1)  # the new key is visible (rows not live: only their own pad key)
        self.logits = self._step(tokens[:, None], self.cols[:, None], cols)
        self.cols += live.long()

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        eng = self.engine
        if not eng.cuda_graphs:
            return eng._decode_step(self.cache, self.hook, tokens, positions, self.mask, cols)
        if self._graph is None:
            static = (torch.zeros_like(tokens), torch.zeros_like(positions), torch.zeros_like(cols))
            self._graph = CapturedStep(
                lambda t, p, c: eng._decode_step(self.cache, self.hook, t, p, self.mask, c), static
            )
        return self._graph(tokens, positions, cols)

    # ------------------------------------------------------------------ admission (prefix-shared prefill)
    def _admit(self) -> None:
        pairs = self.scheduler.admit()
        if not pairs:
            return
        eng = self.engine
        unique: dict[tuple[int, ...], int] = {}
        for _, request in pairs:
            unique.setdefault(tuple(self.prompts[request]), len(unique))
        prompts = [list(p) for p in unique]
        width = max(len(p) for p in prompts)
        ids, mask = eng._left_pad(prompts, width)  # [U, P]
        scratch = eng._new_cache(len(prompts), width)
        logits = eng._prefill(scratch, self.hook, ids, mask)  # [U, V]
        if self.logits is None:
            self.logits = torch.zeros((self.mask.shape[0], logits.shape[-1]), dtype=logits.dtype, device=eng.device)
        for slot, request in pairs:
            prompt = self.prompts[request]
            src, length = unique[tuple(prompt)], len(prompt)
            for dst, buf in ((self.cache.k, scratch.k), (self.cache.v, scratch.v)):
                dst[:, slot, :, :length] = buf[:, src, :, width - length :]  # [L, H_kv, p, D]
            self.mask[slot].zero_()
            self.mask[slot, :length] = 1
            self.logits[slot] = logits[src]
        slots = torch.tensor([s for s, _ in pairs], device=eng.device)
        requests = torch.tensor([r for _, r in pairs], device=eng.device)
        lengths = torch.tensor([len(self.prompts[r]) for _, r in pairs], device=eng.device)
        self.cols[slots] = lengths
        self.requests[slots] = requests
        self.counts[slots] = 0
        self.limits[slots] = torch.tensor([self.caps[r] for _, r in pairs], device=eng.device)
        self.running[slots] = True
        self.stats.admissions = self.scheduler.admissions
        self.stats.peak_live = self.scheduler.peak_live
        self.stats.prefill_tokens += sum(len(p) for p in prompts)
        self.stats.prefill_tokens_shared += sum(len(self.prompts[r]) for _, r in pairs) - sum(len(p) for p in prompts)

    # ------------------------------------------------------------------ output in the shared layout
    def _output(self) -> GenerationOutput:
        eng, n = self.engine, len(self.prompts)
        lengths = self.lengths_out[:n]  # [N]
        prompt_len = max(len(p) for p in self.prompts)
        longest = int(lengths.max())
        ids, mask = eng._left_pad(self.prompts, prompt_len + longest)  # [N, S]
        ids[:, prompt_len:] = self.tokens_out[:n, :longest]
        response = (torch.arange(longest, device=eng.device) < lengths[:, None]).long()  # [N, T]
        mask[:, prompt_len:] = response
        response_mask = torch.zeros_like(mask)
        response_mask[:, prompt_len:] = response
        logprobs = torch.zeros(ids.shape, dtype=torch.float32, device=eng.device)
        logprobs[:, prompt_len:] = self.logprobs_out[:n, :longest] * response
        self.stats.generated_tokens = int(lengths.sum())
        return GenerationOutput(
            input_ids=ids,
            attention_mask=mask,
            response_mask=response_mask,
            generation_logprobs=logprobs,
            prompt_length=prompt_len,
            response_lengths=lengths.clone(),
            finished=self.finished_out[:n].clone(),
        )
