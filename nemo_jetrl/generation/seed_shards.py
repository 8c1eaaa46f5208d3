"""Rollout seed shards: how one GRPO step's prompts are cut so that results depend on how the work is *cut*, never
on which worker (or which process) runs a piece, and `ShardedGeneration`, the engine that runs the shards: one after
another in one process, or a block of them on each data-parallel group of a sharded trainer's ranks.

The prompts are cut into `num_seed_shards` contiguous shards; shard s samples with its own generator seeded
`shard_seed(base_seed, s)` (shard 0 keeps `base_seed`). A worker runs whole shards, so W workers and one process
with the same shard count draw the same tokens (and, on CPU, the same bits); `merge_generation_outputs` puts the
shards' outputs back together in the shared layout. The trainer-side split lives in distributed/data_split.py.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Protocol

import torch

from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous [start, end) ranges covering range(n); sizes differ by at most one, larger ones first."""
    if parts < 1:
        raise ValueError(f"split_evenly: parts must be >= 1, got {parts}")
    if n < 0:
        raise ValueError(f"split_evenly: n must be >= 0, got {n}")
    base, extra = divmod(n, parts)
    ranges, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def shard_seed(base_seed: int, shard: int) -> int:
    """Seed of rollout shard `shard`: shard 0 keeps `base_seed` (one shard == the unsharded run), others hash it."""
    if shard < 0:
        raise ValueError(f"shard_seed: shard must be >= 0, got {shard}")
    if shard == 0:
        return int(base_seed)
    digest = hashlib.blake2b(f"{int(base_seed)}:{shard}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative int64


def seed_shards(prompt_ids: list[list[int]], num_shards: int, base_seed: int) -> list[tuple[list[list[int]], int]]:
    """Cut prompts into `num_shards` contiguous (prompts, seed) shards; empty shards are dropped."""
    shards = []
    for s, (lo, hi) in enumerate(split_evenly(len(prompt_ids), num_shards)):
        if hi > lo:
            shards.append((prompt_ids[lo:hi], shard_seed(base_seed, s)))
    return shards


def merge_generation_outputs(outputs: Sequence[GenerationOutput], pad_token_id: int) -> GenerationOutput:
    """Concatenate shard outputs row-wise in the shared layout.

    Each shard is re-left-padded to the widest prompt P and right-padded to the widest P + T: pads carry
    attention_mask 0, response_mask 0, logprob 0, so `position_ids = cumsum(mask) - 1` of every row is unchanged.
    """
    if not outputs:
        raise ValueError("merge_generation_outputs: no outputs to merge")
    if len(outputs) == 1:
        return outputs[0]
    prompt_len = max(o.prompt_length for o in outputs)
    resp_len = max(o.input_ids.shape[1] - o.prompt_length for o in outputs)
    width = prompt_len + resp_len

    def place(t: torch.Tensor, out: GenerationOutput, fill) -> torch.Tensor:  # t: [b, S_o] -> [b, width]
        left = prompt_len - out.prompt_length
        right = width - left - t.shape[1]
        return torch.nn.functional.pad(t, (left, right), value=fill)

    return GenerationOutput(
        input_ids=torch.cat([place(o.input_ids, o, pad_token_id) for o in outputs]),
        attention_mask=torch.cat([place(o.attention_mask, o, 0) for o in outputs]),
        response_mask=torch.cat([place(o.response_mask, o, 0) for o in outputs]),
        generation_logprobs=torch.cat([place(o.generation_logprobs, o, 0.0) for o in outputs]),
        prompt_length=prompt_len,
        response_lengths=torch.cat([o.response_lengths for o in outputs]),
        finished=torch.cat([o.finished for o in outputs]),
        routed_experts=_merged_routing(outputs, prompt_len, width),
    )


def _merged_routing(outputs: Sequence[GenerationOutput], prompt_len: int, width: int) -> torch.Tensor | None:
    """The outputs' `routed_experts` [b, S_o, L, k] placed as `merge_generation_outputs` places their tokens (None
    unless every output has them)."""
    if any(o.routed_experts is None for o in outputs):
        return None
    placed = []
    for o in outputs:
        r = o.routed_experts
        out = r.new_zeros((r.shape[0], width, *r.shape[2:]))
        left = prompt_len - o.prompt_length
        out[:, left : left + r.shape[1]] = r
        placed.append(out)
    return torch.cat(placed)


def generate_seed_shards(
    engine: GenerationInterface,
    shards: Sequence[tuple[list[list[int]], int]],
    *,
    greedy: bool,
    device: torch.device | str,
) -> list[GenerationOutput]:
    """Run `engine` once per (prompts, seed) shard, each with a fresh generator on `device`; outputs on CPU."""
    outs = []
    for prompts, seed in shards:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        outs.append(engine.generate(prompts, greedy=greedy, generator=gen).to("cpu"))
    return outs


class RankShare(Protocol):
    """What the rollout needs of the ranks it runs on (`policy.parallel.plan.ParallelPlan` is one)."""

    @property
    def distributed(self) -> bool: ...

    def share(self, pieces: Sequence) -> tuple[list, int]: ...  # this data-parallel group's contiguous block

    def gather(self, mine: list) -> list: ...  # every group's block, in group order, on every rank (collective)


class ShardedGeneration(GenerationInterface):
    """The rollout in seed shards: run one after another by one engine in one process (the twin of a sharded run),
    or, with a `plan` over several ranks, each data-parallel group running its contiguous block of the shards on
    its own engine (the TP ranks of a group together) and every rank getting all of them back, merged in order.

    With one shard in one process it is a pass-through (the caller's generator is used as is). Otherwise shard
    seeds derive from `generator.initial_seed()` (the GRPO driver hands a freshly seeded generator per step).
    """

    def __init__(
        self, engine: GenerationInterface, num_seed_shards: int, pad_token_id: int, plan: RankShare | None = None
    ) -> None:
        if num_seed_shards < 1:
            raise ValueError(f"cluster.rollout_seed_shards must be >= 1, got {num_seed_shards}")
        self.engine = engine
        self.num_seed_shards = int(num_seed_shards)
        self.pad_token_id = int(pad_token_id)
        self.plan = plan
        self._timings: dict[str, float] = {}  # the last sharded rollout's parts (`rollout_timings`)

    def __getattr__(self, name: str):  # the wrapped engine's attributes (device, model, ...)
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    def replace(self, **changes) -> ShardedGeneration:
        """The wrapped engine's `replace(**changes)`, sharded the same way (e.g. the KV calibration rollout)."""
        return ShardedGeneration(self.engine.replace(**changes), self.num_seed_shards, self.pad_token_id, self.plan)

    @property
    def _distributed(self) -> bool:
        return self.plan is not None and self.plan.distributed

    @property
    def _passes_through(self) -> bool:
        """One shard in one process: the rollout is the engine's one call, with the caller's generator."""
        return self.num_seed_shards == 1 and not self._distributed

    def generate(self, prompt_ids, *, greedy=False, generator=None) -> GenerationOutput:
        if self._passes_through:
            return self.engine.generate(prompt_ids, greedy=greedy, generator=generator)
        base = generator.initial_seed() if generator is not None else torch.initial_seed()
        device = generator.device if generator is not None else torch.device("cpu")
        shards = seed_shards(prompt_ids, self.num_seed_shards, base)
        self._timings = {}
        if self._distributed:
            mine, _ = self.plan.share(shards)
            local = generate_seed_shards(self.engine, mine, greedy=greedy, device=device)
            timings = self.engine.rollout_timings() if len(mine) == 1 else {}
            start = time.perf_counter()
            outs = self.plan.gather(local)
            self._timings = {**timings, "rank_gather": time.perf_counter() - start}
        else:
            outs = generate_seed_shards(self.engine, shards, greedy=greedy, device=device)
        return merge_generation_outputs(outs, self.pad_token_id)

    def rollout_timings(self) -> dict[str, float]:
        """The engine's, where the rollout was its one call (one shard, one process). On several ranks: this rank's
        engine's parts where it ran one shard, and `rank_gather`, the seconds it spent gathering every group's
        rollout, waiting for the slowest group included. Else not measured: {}."""
        return self.engine.rollout_timings() if self._passes_through else dict(self._timings)

    def prepare_for_generation(self) -> bool:
        return self.engine.prepare_for_generation()

    def finish_generation(self) -> bool:
        return self.engine.finish_generation()

    def update_weights(self, weights=None, *, kv_scales=None) -> None:
        self.engine.update_weights(weights, kv_scales=kv_scales)

    @property
    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.engine.kv_scales
