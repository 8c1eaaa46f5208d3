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
  A request whose prompt is held by a running sequence (its owner: the first of the group admitted, prefilled
  then) shares the owner's full prompt blocks by reference and copies its last partial block, in this round or a
  later one, and is not prefilled; the entry lives as long as its owner runs (`prefixes`).
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
class Prefix:
    """A running owner's prompt: its full blocks, the block holding the prompt's last partial block (or None)."""

    owner: int
    full: list[int]
    partial: int | None


@dataclass
class Running:
    """One admitted sequence: its blocks (table order), the batch row it held at the last sync (None: new)."""

    request: int
    blocks: list[int]
    order: int  # admission counter: the largest is the most recently admitted
    prefill_tokens: int  # tokens at admission (prompt, plus the generated ones on readmission)
    prefix: Prefix | None = None  # the owner's prompt this sequence shares instead of being prefilled
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
    prefixes: dict = field(default_factory=dict)  # prompt key -> Prefix of its running owner
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
            self._leave(seq)
            self._log("finish", seq.request)

    def _leave(self, seq: Running) -> None:
        """Free a sequence's blocks; its prompt stops being shareable if it owned it."""
        self.pool.release(seq.blocks)
        key = self.prompt_keys[seq.request]
        if key in self.prefixes and self.prefixes[key].owner == seq.request:
            del self.prefixes[key]

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
            self._leave(victim)
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
        while self.waiting and len(self.rows) < self.max_rows:
            request = self.waiting[0]
            resumed = request in self.resume_tokens
            tokens = self.resume_tokens.get(request, self.prompt_lens[request])
            total = self.blocks_for(min(tokens + self.lookahead, self.max_tokens[request]))
            key = self.prompt_keys[request]
            prefix = None if resumed else self.prefixes.get(key)
            if total - (len(prefix.full) if prefix else 0) > self.pool.num_free:
                break
            self.waiting.popleft()
            self.resume_tokens.pop(request, None)
            if prefix:
                self.pool.share(prefix.full)
                blocks = prefix.full + self.pool.allocate(total - len(prefix.full))
            else:
                blocks = self.pool.allocate(total)
                full, rest = divmod(self.prompt_lens[request], self.block_size)
                if not resumed:
                    self.prefixes[key] = Prefix(request, blocks[:full], blocks[full] if rest else None)
            self._order += 1
            seq = Running(request, blocks, self._order, tokens, prefix)
            self.rows.append(seq)
            admitted.append(seq)
            self._log("admit", request)
        if admitted:
            self.admissions += 1
            self.peak_live = max(self.peak_live, len(self.rows))
        return admitted
