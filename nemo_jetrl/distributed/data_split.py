"""How one GRPO step's global batch is split across data-parallel workers, and merged back.

Results depend on how the work is *cut*, never on which worker runs a piece:

- rollout: the prompts are cut into seed shards, whole shards per worker (generation/seed_shards.py).
- logprobs: contiguous rows per worker (per-row results do not depend on the batch they sit in).
- training: the global batch is cut into micro-batches of `train_micro_batch_size` rows exactly as the single-process
  trainer cuts it, then contiguous blocks of micro-batches go to the workers; per-micro-batch metrics come back and
  are averaged over the same micro-batches, and the gradient is the same sum of micro-batch gradients.

Workers that run FSDP collectives must call forward the same number of times: `pad_to` tells each worker how many
steps to run (dummy steps contribute nothing).

With tensor parallel (T ranks per group) the pieces go to the W / T data-parallel groups: every rank of a group gets
its group's piece (`per_rank`), and one result per group comes back (`group_leaders`).
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_jetrl.generation.seed_shards import split_evenly


def assign_contiguous(items: Sequence, num_workers: int) -> list[list]:
    """Contiguous blocks of `items` per worker (sizes differ by at most one, earlier workers larger)."""
    return [list(items[lo:hi]) for lo, hi in split_evenly(len(items), num_workers)]


def per_rank(blocks: Sequence, tp: int) -> list:
    """Each data-parallel group's block, once for each of its `tp` ranks (consecutive ranks form a TP group)."""
    return [block for block in blocks for _ in range(tp)]


def group_leaders(results: Sequence, tp: int) -> list:
    """The result of TP rank 0 of every data-parallel group, in group order."""
    return list(results[::tp])

