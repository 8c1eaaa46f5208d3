"""Continuous batching for the native engine: a queue of sequences over a paged KV cache.

KV lives in blocks of a shared pool (`paged_kv_cache.py`), taken as sequences grow (`block_scheduler.py`), so the
number of sequences decoded at once follows their real lengths. The decode batch is a set of rows kept compact:
every `sync_every` decode steps the host reads which rows finished and how long the others are, frees finished
sequences' blocks, gives the running ones blocks for the next window (preempting the most recently admitted when
the pool runs dry), admits waiting sequences, moves the rows that stay to the front, and picks the smallest
CUDA-graph bucket that holds them (`cuda_graph.BucketedSteps`). A GRPO group's prompt is prefilled once, by the
first member admitted (its owner); members admitted while the owner runs share its full prompt blocks by
reference, copy its last partial block and take its next-token logits. A preempted sequence is prefilled again
with the tokens it had generated and goes on where it stopped.

Sampling streams are per sequence (`sampler.sequence_keys` of the request index, draw index = token index), so a
sequence's tokens do not depend on the batch around it, on when it was admitted or on a preemption, as far as its
logits do not (CPU: equal greedy and sampled tokens with and without continuous batching and preemption).
The output is the engine's shared layout (prompts left-padded to the longest, responses from column P).

The exact mode and matched kernels (`models.batch_invariant`): admission prefills run the batch-invariant prefill
(the scratch cache's K/V copied into the blocks as stored), decode steps the batch-invariant attention read through
the block table (`PagedKVCache.exact_decode_attention`). A row's bits then follow neither its batch, nor its
admission round, nor a preemption (decode == prefill bitwise: a re-prefill writes the same K/V), nor a shared
prompt: with every part exact, the rollout's logprobs equal the trainer's forward and the unbudgeted run's bitwise.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch

from nemo_jetrl.generation.interfaces import GenerationOutput
from nemo_jetrl.generation.native.block_scheduler import BlockPool, BlockScheduler, Running
from nemo_jetrl.generation.native.cuda_graph import BucketedSteps, bucket_for, bucket_sizes
from nemo_jetrl.generation.native.paged_kv_cache import PagedKVCache
from nemo_jetrl.generation.native.prompts import left_pad
from nemo_jetrl.generation.native.sampler import sample, seed_of, sequence_keys
from nemo_jetrl.generation.native.scheduler import KvBudget


@dataclass
class RolloutStats:
    """What one continuous-batching rollout did (`engine.last_rollout_stats`)."""

    num_sequences: int = 0
    num_rows: int = 0  # most sequences decoded at once (max_num_seqs, within the pool)
    num_blocks: int = 0  # pool size, the trash block included
    block_size: int = 0
    kv_cache_bytes: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    row_steps_live: int = 0  # sum over decode steps of the rows holding a running sequence
    bucket_steps: dict[int, int] = field(default_factory=dict)  # decode steps run at each batch bucket
    admissions: int = 0  # admission rounds
    peak_live: int = 0
    peak_blocks_used: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0  # tokens run through the model at admission (padding excluded)
    prefill_tokens_shared: int = 0  # prompt tokens shared with a running group owner instead of prefilled
    prefill_tokens_recomputed: int = 0  # generated tokens prefilled again after a preemption
    key_reads: int = 0  # sum over decode steps of the keys each running row attended to (its KV length)
    rollout_s: float = 0.0  # device time of the whole rollout (stream marks, no extra host sync)
    admission_s: float = 0.0  # of which admissions: prefills, prompt sharing, row compaction
    capture_s: float = 0.0  # of which CUDA-graph captures (one per bucket the rollout meets)

    def timings(self) -> dict[str, float]:
        """The parts of the rollout's device time `GenerationInterface.rollout_timings` reports."""
        return rollout_time_parts(self.rollout_s, cuda_graph_capture=self.capture_s, admission=self.admission_s)

    @property
    def occupancy(self) -> float:
        """Mean fraction of the rows holding a running sequence per decode step."""
        return self.row_steps_live / max(1, self.decode_steps * self.num_rows)


def rollout_time_parts(whole: float, **parts: float) -> dict[str, float]:
    """A rollout's device time `whole` (s) in its named parts and "decode": the rest (the decode steps and the host
    syncs between windows)."""
    return {**parts, "decode": whole - sum(parts.values())}


class StreamClock:
    """Marks on the current stream, read after the rollout's final sync: CUDA events (no host sync when set), the
    host clock elsewhere (CPU ops run in order). A span between two marks includes the time the device waited for
    the host (e.g. the garbage collection before a graph capture)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list] = defaultdict(list)  # name -> [(begin, end) marks]

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def total(self, span: str) -> float:
        return sum(self.seconds(a, b) for a, b in self.spans[span])

    @contextlib.contextmanager
    def span(self, name: str):
        """Marks the block's begin and end as one more span of `name`."""
        begin = self.mark()
        yield
        self.spans[name].append((begin, self.mark()))


class ContinuousRollout:
    """One `generate` call of `engine` (a NativeGenerationEngine) over the paged pool `budget` describes."""

    def __init__(self, engine, prompt_ids: list[list[int]], budget: KvBudget, caps: list[int]) -> None:
        self.engine, self.prompts, self.caps = engine, prompt_ids, caps
        dev, rows = engine.device, budget.num_rows
        self.cache = PagedKVCache.for_model(
            engine.model, budget.num_blocks, budget.block_size, rows, budget.max_blocks_per_seq,
            dtype=engine.kv_cache_dtype, device=dev, fused_decode=engine.fused_decode,
        )  # fmt: skip
        if self.cache.is_fp8:
            if engine.kv_scales is None:
                raise ValueError("kv_cache_dtype=fp8 needs KV scales: call update_weights(kv_scales=(k, v)) first")
            self.cache.set_scales(*engine.kv_scales)
        self.table_host = torch.zeros((rows, budget.max_blocks_per_seq), dtype=torch.int32)  # [rows, M]
        # attention mask of the twin path: all ones, the causal bound at each row's column does the rest
        self.ones = torch.ones((rows, self.cache.max_seq_len), dtype=torch.long, device=dev)  # [rows, S]
        self.cols = torch.zeros(rows, dtype=torch.long, device=dev)  # [rows] tokens in the cache = next position
        self.requests = torch.zeros(rows, dtype=torch.long, device=dev)  # [rows]
        self.counts = torch.zeros(rows, dtype=torch.long, device=dev)  # [rows] tokens generated so far
        self.limits = torch.zeros(rows, dtype=torch.long, device=dev)  # [rows] response cap
        self.running = torch.zeros(rows, dtype=torch.bool, device=dev)  # [rows]
        self.logits: torch.Tensor | None = None  # [n, V] next-token logits of the bucket's rows
        n, t = len(prompt_ids), max(caps)
        self.tokens_out = torch.full((n + 1, t), engine.pad_token_id, dtype=torch.long, device=dev)  # row n: trash
        self.logprobs_out = torch.zeros((n + 1, t), dtype=torch.float32, device=dev)  # [N + 1, T]
        self.lengths_out = torch.zeros(n + 1, dtype=torch.long, device=dev)  # [N + 1]
        self.finished_out = torch.zeros(n + 1, dtype=torch.bool, device=dev)  # [N + 1]
        self.scheduler = BlockScheduler(
            BlockPool(budget.num_blocks), budget.block_size, rows, engine.sync_every,
            prompt_keys=[tuple(p) for p in prompt_ids], prompt_lens=[len(p) for p in prompt_ids],
            max_tokens=[len(p) + c - 1 for p, c in zip(prompt_ids, caps)],  # the last token is never fed back
        )  # fmt: skip
        self.stats = RolloutStats(n, rows, budget.num_blocks, budget.block_size, self.cache.nbytes)
        self.group_left = Counter(self.scheduler.prompt_keys)  # prompt key -> requests not yet admitted once
        self.prompt_logits: dict = {}  # prompt key -> its owner's next-token logits [V], while members may follow
        self.buckets = bucket_sizes(rows)
        self.n = 0  # rows of the current bucket
        self._graphs: BucketedSteps | None = None
        self.clock = StreamClock(dev)
        self.key_reads = torch.zeros((), dtype=torch.long, device=dev)  # [] device-side sum of KV lengths read

    # ------------------------------------------------------------------ the loop
    def run(self, greedy: bool, generator: torch.Generator | None) -> GenerationOutput:
        eng = self.engine
        keys_all = sequence_keys(seed_of(generator), torch.arange(len(self.prompts), device=eng.device))  # [N]
        stop_ids = torch.tensor(eng.stop_token_ids, dtype=torch.long, device=eng.device)
        trash = len(self.prompts)
        hook = eng.attn_hook_factory() if eng.attn_hook_factory is not None else None
        self.plan = eng.forward_plan.with_hook(hook)  # this rollout's forward, for every prefill and decode step
        live_steps = torch.zeros((), dtype=torch.long, device=eng.device)
        start = self.clock.mark()
        self._sync()
        step = 0
        while True:
            n = self.n
            live = self.running[:n].clone()  # [n] rows whose token this step is real
            counts = self.counts[:n]
            tokens, logprobs = sample(
                self.logits, eng.sampling, greedy=greedy, keys=keys_all[self.requests[:n]], counters=counts,
                batch_invariant=self.plan.exact.logsumexp,
            )  # [n] each  # fmt: skip
            rows = torch.where(live, self.requests[:n], trash)  # rows not running write the trash row
            cols = torch.where(live, counts, 0)
            self.tokens_out.index_put_((rows, cols), tokens)
            self.logprobs_out.index_put_((rows, cols), logprobs)
            stopped = live & torch.isin(tokens, stop_ids)
            counts += live.long()
            self.lengths_out.index_put_((rows,), counts)
            self.finished_out.index_put_((rows,), stopped)
            self.running[:n] = live & ~stopped & (counts < self.limits[:n])
            live_steps += live.sum()
            step += 1
            self.stats.bucket_steps[n] = self.stats.bucket_steps.get(n, 0) + 1
            self._decode(torch.where(self.running[:n], tokens, eng.pad_token_id))
            if step % eng.sync_every == 0 and self._sync():
                break
        end = self.clock.mark()
        self.stats.decode_steps = step
        self.stats.row_steps_live = int(live_steps)  # a host sync: every mark above has completed
        self.stats.key_reads = int(self.key_reads)
        self.stats.rollout_s = self.clock.seconds(start, end)
        self.stats.admission_s, self.stats.capture_s = self.clock.total("admission"), self.clock.total("capture")
        self._graphs = None  # the graphs close over self: drop them here, not in a later garbage collection
        return self._output()

    def _decode(self, tokens: torch.Tensor) -> None:
        """Feed each running row's token [n] at its column; other rows point at the trash block, column 0."""
        n = self.n
        run = self.running[:n]
        self.cache.table[:n].mul_(run[:, None].to(torch.int32))  # a stopped row's blocks are no longer touched
        cols = torch.where(run, self.cols[:n], 0)  # [n]
        self.key_reads += (cols + run).sum()  # a running row reads cols + 1 keys, a stopped one none (cols 0)
        self.logits = self._step(tokens[:, None], cols[:, None], cols)
        self.cols[:n] += run.long()

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """One decode step of the n = bucket rows: tokens/positions [n, 1], cols [n]. Returns logits [n, V]."""
        eng, n = self.engine, self.n
        if not eng.cuda_graphs:
            return eng._decode_step(self.cache, self.plan, tokens, positions, self.ones[:n], cols)
        if self._graphs is None:
            self._graphs = BucketedSteps(
                lambda b: lambda t, p, c: eng._decode_step(self.cache, self.plan, t, p, self.ones[:b], c),
                self._static_inputs,
            )
        if n in self._graphs.steps:
            return self._graphs(n, tokens, positions, cols)
        with self.clock.span("capture"):  # this bucket's first call captures its graph
            return self._graphs(n, tokens, positions, cols)

    def _static_inputs(self, bucket: int) -> tuple[torch.Tensor, ...]:
        """A bucket's captured inputs: tokens [b, 1], positions [b, 1], cols [b]."""
        dev = self.engine.device
        return (
            torch.zeros((bucket, 1), dtype=torch.long, device=dev),
            torch.zeros((bucket, 1), dtype=torch.long, device=dev),
            torch.zeros(bucket, dtype=torch.long, device=dev),
        )

    # ------------------------------------------------------------------ host sync: finish, grow, admit, compact
    def _sync(self) -> bool:
        """Host bookkeeping between decode windows; True when every sequence is done."""
        sched, n = self.scheduler, self.n
        state = torch.stack([self.running[:n].long(), self.cols[:n]]).tolist() if n else [[], []]
        live = len(sched.rows)
        sched.finish([r for r in range(live) if not state[0][r]])
        sched.grow([state[1][s.row] for s in sched.rows])
        self.stats.preemptions = sched.preemptions
        if sched.done:
            self._finish_stats()
            return True
        kept = [s.row for s in sched.rows]
        admitted = sched.admit()
        for row, seq in enumerate(sched.rows):
            seq.row = row
        with self.clock.span("admission"):
            self._compact(kept, admitted)
        self._finish_stats()
        return False

    def _compact(self, kept: list[int], admitted: list[Running]) -> None:
        """Rows `kept` (old indices, in order) move to the front, the admitted sequences follow them."""
        dev, k = self.engine.device, len(kept)
        live = k + len(admitted)
        new_n = bucket_for(live, self.buckets)
        idx = torch.tensor(kept, dtype=torch.long, device=dev)
        for state in (self.cols, self.requests, self.counts, self.limits, self.running):
            state[:k] = state[idx]
            state[k:] = 0
        parts = [self.logits[idx]] if k else []
        if admitted:
            parts.append(self._prefill(admitted, k))
        vocab = parts[0].shape[-1]
        parts.append(torch.zeros((new_n - live, vocab), dtype=parts[0].dtype, device=dev))
        self.logits = torch.cat(parts)  # [new_n, V]
        self.table_host.zero_()
        for row, seq in enumerate(self.scheduler.rows):
            self.table_host[row, : len(seq.blocks)] = torch.tensor(seq.blocks, dtype=torch.int32)
        self.cache.table.copy_(self.table_host)
        self.n = new_n

    def _prefill(self, admitted: list[Running], first_row: int) -> torch.Tensor:
        """Prefill the admitted sequences that own their prompt or resume (their K/V into their blocks); the others
        share a running owner's prompt blocks and copy its partial block. Sets their rows' state; returns their
        next-token logits [len(admitted), V]."""
        dev, stats = self.engine.device, self.stats
        rows: dict[int, torch.Tensor] = {}  # index in admitted -> logits [V]
        fresh = [i for i, s in enumerate(admitted) if s.prefix is None]
        if fresh:
            logits = self._run_prefill([admitted[i] for i in fresh])  # [F, V]
            for i, row in zip(fresh, logits):
                rows[i] = row
        for i, seq in enumerate(admitted):
            key = self.scheduler.prompt_keys[seq.request]
            if seq.prefill_tokens > len(self.prompts[seq.request]):
                continue  # a resumed sequence: not a first admission
            self.group_left[key] -= 1
            if seq.prefix is None and self.group_left[key] > 0:
                self.prompt_logits[key] = rows[i]  # later members of the group take these
            elif seq.prefix is not None:
                if seq.prefix.partial is not None:
                    self.cache.copy_block(seq.prefix.partial, seq.blocks[len(seq.prefix.full)])
                rows[i] = self.prompt_logits[key]
                stats.prefill_tokens_shared += len(self.prompts[seq.request])
            if self.group_left[key] == 0:
                self.prompt_logits.pop(key, None)
        index = torch.arange(first_row, first_row + len(admitted), device=dev)
        self.cols[index] = torch.tensor([s.prefill_tokens for s in admitted], device=dev)
        self.requests[index] = torch.tensor([s.request for s in admitted], device=dev)
        self.counts[index] = torch.tensor(
            [s.prefill_tokens - len(self.prompts[s.request]) for s in admitted], device=dev
        )
        self.limits[index] = torch.tensor([self.caps[s.request] for s in admitted], device=dev)
        self.running[index] = True
        stats.prefill_tokens_recomputed += sum(s.prefill_tokens - len(self.prompts[s.request]) for s in admitted)
        return torch.stack([rows[i] for i in range(len(admitted))])

    def _run_prefill(self, seqs: list[Running]) -> torch.Tensor:
        """One left-padded prefill of the sequences' tokens (prompt + generated ones), K/V copied into their blocks
        from the first; returns their next-token logits [len(seqs), V]."""
        eng = self.engine
        tokens = []
        for seq in seqs:
            generated = seq.prefill_tokens - len(self.prompts[seq.request])
            tokens.append(list(self.prompts[seq.request]) + (self.tokens_out[seq.request, :generated].tolist()))
        width = max(len(t) for t in tokens)
        ids, mask = left_pad(tokens, width, eng.pad_token_id, eng.device)  # [F, P]
        scratch = eng._new_cache(len(tokens), width)
        logits = eng._prefill(scratch, self.plan, ids, mask)  # [F, V]
        for i, (seq, toks) in enumerate(zip(seqs, tokens)):
            start = width - len(toks)
            self.cache.write_blocks(
                seq.blocks, scratch.k[:, i, :, start:], scratch.v[:, i, :, start:]
            )  # [L, H_kv, n, D]
        self.stats.prefill_tokens += sum(len(t) for t in tokens)
        return logits

    def _finish_stats(self) -> None:
        sched, stats = self.scheduler, self.stats
        stats.admissions, stats.peak_live = sched.admissions, sched.peak_live
        stats.peak_blocks_used, stats.preemptions = sched.peak_blocks, sched.preemptions

    # ------------------------------------------------------------------ output in the shared layout
    def _output(self) -> GenerationOutput:
        eng, n = self.engine, len(self.prompts)
        lengths = self.lengths_out[:n]  # [N]
        prompt_len = max(len(p) for p in self.prompts)
        longest = int(lengths.max())
        ids, mask = left_pad(self.prompts, prompt_len + longest, eng.pad_token_id, eng.device)  # [N, S]
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
