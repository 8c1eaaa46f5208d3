"""Paged-KV bookkeeping on the host: a pool of ref-counted blocks and the scheduler that admits, grows, preempts.

`BlockPool` hands out blocks 1..num_blocks-1 (block 0 is the trash block: rows not running read and write there)
and counts references, so a GRPO group's full prompt blocks are held by every member and freed with the last one.

`BlockScheduler` keeps the decode batch as an ordered list of running sequences (`rows`: list index = batch row
after compaction) and a FIFO of waiting requests. At every host sync the rollout calls, in order:
- `finish(rows)`: the sequences in those rows ended; their blocks go back to the pool;
- `grow(cached)`: every running sequence gets the blocks its next `lookahead` tokens need; when the pool runs
  short, the most recently admitted sequence is preempted (blocks freed, requeued at the front with the tokens it
  has, to be prefilled again: recompute), until the rest fit;
- `admit()`: waiting requests, in order, while a row and their blocks (prefill tokens + lookahead) are free.
  Requests with the same prompt admitted in one round share the prompt's full blocks (the owner writes them);
  each member gets its own copy of the last partial block.
Every step appends to `events` (kind, request, blocks in use), so a test can assert the whole history.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class BlockPool:
    """Free list and reference counts over blocks 1..num_blocks-1; block 0 is never handed out."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"BlockPool needs >= 2 blocks (one is the trash block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))  # pop() hands out 1, 2, 3, ...

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise ValueError(f"BlockPool: {n} blocks asked, {len(self._free)} free")
        blocks = [self._free.pop() for _ in range(n)]
        for b in blocks:
            self.refs[b] = 1
        return blocks

    def share(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.refs[b] < 1:
                raise ValueError(f"BlockPool: block {b} is not allocated")
            self.refs[b] += 1

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.refs[b] < 1:
                raise ValueError(f"BlockPool: block {b} is already free")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self._free.append(b)


@dataclass
class Running:
    """One admitted sequence: its blocks (table order), the batch row it held at the last sync (None: new)."""

    request: int
    blocks: list[int]
    order: int  # admission counter: the largest is the most recently admitted
    prefill_tokens: int  # tokens prefilled at admission (prompt, plus the generated ones on readmission)
    shared_blocks: int = 0  # leading blocks shared with a group member admitted before it in the same round
    row: int | None = None


@dataclass
class BlockScheduler:
    """Requests 0..N-1 over at most `max_rows` running sequences and `pool`; see the module docstring.

    prompt_keys[r]: what identifies request r's prompt (equal keys share blocks); prompt_lens[r]: its tokens;
    max_tokens[r]: the most tokens request r ever holds in the cache."""

    pool: BlockPool
    block_size: int
    max_rows: int
    lookahead: int
    prompt_keys: list
    prompt_lens: list[int]
    max_tokens: list[int]
    rows: list[Running] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    events: list[tuple[str, int, int]] = field(default_factory=list)
    resume_tokens: dict[int, int] = field(default_factory=dict)  # preempted request -> tokens to prefill again
    admissions: int = 0  # admission rounds
    preemptions: int = 0
    peak_live: int = 0
    peak_blocks: int = 0
    _order: int = 0

    def __post_init__(self) -> None:
        n = len(self.prompt_lens)
        if n < 1 or self.max_rows < 1 or self.block_size < 1 or self.lookahead < 1:
            raise ValueError("BlockScheduler needs >= 1 request, row, block size and lookahead")
        worst = self.blocks_for(max(self.max_tokens))
        if worst > self.pool.num_blocks - 1:
            raise ValueError(f"BlockScheduler: a sequence needs {worst} blocks, the pool has {self.pool.num_blocks - 1}")
        self.waiting = deque(range(n))

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def done(self) -> bool:
        return not self.waiting and not self.rows

    def _log(self, kind: str, request: int) -> None:
        self.events.append((kind, request, self.pool.num_used))
        self.peak_blocks = max(self.peak_blocks, self.pool.num_used)

    def finish(self, rows: list[int]) -> None:
        """The sequences in batch rows `rows` (indices into `self.rows`) ended: free their blocks."""
        for i in sorted(rows, reverse=True):
            seq = self.rows.pop(i)
            self.pool.release(seq.blocks)
            self._log("finish", seq.request)

    def grow(self, cached: list[int]) -> list[int]:
        """Blocks for each running sequence's next `lookahead` tokens; cached[i]: tokens row i holds now.
        Preempts the most recently admitted sequences while the pool is short; returns their requests."""
        if len(cached) != len(self.rows):
            raise ValueError(f"grow: {len(cached)} cache lengths for {len(self.rows)} running sequences")
        held = dict(zip((id(s) for s in self.rows), cached))
        needs = {id(s): self._need(s, held[id(s)]) for s in self.rows}
        preempted = []
        while sum(needs.values()) > self.pool.num_free:
            victim = max(self.rows, key=lambda s: s.order)
            self.rows.remove(victim)
            del needs[id(victim)]
            self.pool.release(victim.blocks)
            self.resume_tokens[victim.request] = held[id(victim)]
            preempted.append(victim.request)
            self.preemptions += 1
            self._log("preempt", victim.request)
        for request in preempted:  # the latest victim first, so the earliest admitted ends at the front
            self.waiting.appendleft(request)
        for seq in self.rows:
            seq.blocks += self.pool.allocate(needs[id(seq)])
        self.peak_blocks = max(self.peak_blocks, self.pool.num_used)
        return preempted

    def _need(self, seq: Running, cached: int) -> int:
        return max(0, self.blocks_for(min(cached + self.lookahead, self.max_tokens[seq.request])) - len(seq.blocks))

    def admit(self) -> list[Running]:
        """Waiting requests admitted in queue order while a row and their blocks are free (appended to rows)."""
        admitted: list[Running] = []
        shared: dict = {}  # prompt key -> the full prompt blocks of this round's first member
        while self.waiting and len(self.rows) < self.max_rows:
            request = self.waiting[0]
            resumed = request in self.resume_tokens
            tokens = self.resume_tokens.get(request, self.prompt_lens[request])
            total = self.blocks_for(min(tokens + self.lookahead, self.max_tokens[request]))
            owner = None if resumed else shared.get(self.prompt_keys[request])
            if total - (len(owner) if owner else 0) > self.pool.num_free:
                break
            self.waiting.popleft()
            self.resume_tokens.pop(request, None)
            if owner:
                self.pool.share(owner)
                blocks = owner + self.pool.allocate(total - len(owner))
            else:
                blocks = self.pool.allocate(total)
                full = self.prompt_lens[request] // self.block_size
                if not resumed and full:
                    shared[self.prompt_keys[request]] = blocks[:full]
            self._order += 1
            seq = Running(request, blocks, self._order, tokens, len(owner) if owner else 0)
            self.rows.append(seq)
            admitted.append(seq)
            self._log("admit", request)
        if admitted:
            self.admissions += 1
            self.peak_live = max(self.peak_live, len(self.rows))
        return admitted
