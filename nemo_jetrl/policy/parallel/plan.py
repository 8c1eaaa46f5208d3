"""How one trainer spreads over the ranks of a process group: the parallel plan the trainer core is parameterised by.

- "none": one process, one device (world size 1): no collective anywhere.
- "fsdp": W ranks, each an FSDP2 shard of the trainer (the FP8 linears' master shards feed one FP8 all-gather per
  optimizer step, `fp8_gather.py`) and a rollout replica.
- "fsdp_tp": W / T data-parallel groups of T tensor-parallel ranks (`policy.dtensor_cfg.tensor_parallel_size`), a
  (dp, tp) mesh: TP within a group, FSDP2 over dp (tensor_parallel.py).

How a pass is cut does not depend on the plan (`policy/micro_batches.py` cuts every pass the one-process way);
the plan hands each data-parallel group a contiguous block of the pieces (`share`), runs as many forwards on every
rank (FSDP2 collectives stay in lock-step: ranks with fewer pieces run zero-weighted dummies), and gathers what the
groups computed back in piece order on every rank (`gather`), so every rank ends with the one-process result.
Python objects travel over a gloo group (`object_group`), tensors of the trainer over the device's backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from nemo_jetrl.generation.seed_shards import split_evenly

PlanKind = Literal["none", "fsdp", "fsdp_tp"]


@dataclass(frozen=True)
class ParallelPlan:
    kind: PlanKind = "none"
    world_size: int = 1
    rank: int = 0
    tp: int = 1
    mesh: Any = None  # DeviceMesh (dp,) or (dp, tp); None for "none"
    object_group: Any = None  # gloo ProcessGroup for Python objects (None: the default group, or none at all)

    @classmethod
    def single(cls) -> ParallelPlan:
        return cls()

    @classmethod
    def from_process_group(cls, device: torch.device, tensor_parallel_size: int = 1) -> ParallelPlan:
        """The plan over every rank of the initialized default process group; "none" when it has one rank."""
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise ValueError("a parallel plan over several ranks needs torch.distributed to be initialized")
        world, tp = dist.get_world_size(), int(tensor_parallel_size)
        if world % tp:
            raise ValueError(f"policy.dtensor_cfg.tensor_parallel_size ({tp}) must divide the ranks ({world})")
        if world == 1:
            return cls.single()
        if tp > 1:
            mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
        else:
            mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
        objects = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        kind: PlanKind = "fsdp_tp" if tp > 1 else "fsdp"
        return cls(kind, world, dist.get_rank(), tp, mesh, objects)

    # ------------------------------------------------------------------ layout
    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def num_dp_groups(self) -> int:
        return self.world_size // self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, prints and writes checkpoints."""
        return self.rank == 0

    @property
    def dp_mesh(self):
        return None if self.mesh is None else self.mesh["dp"]

    @property
    def dp_group(self):
        """The data-parallel group (the refit's all-gather, FSDP2's shards); None = every rank (no TP) or no group."""
        return None if self.mesh is None else self.mesh["dp"].get_group()

    @property
    def tp_group(self):
        return None if self.kind != "fsdp_tp" else self.mesh["tp"].get_group()

    # ------------------------------------------------------------------ cutting and gathering
    def share(self, pieces: Sequence) -> tuple[list, int]:
        """This rank's contiguous block of `pieces` (its data-parallel group's) and the most pieces any group runs
        (the number of forwards every rank makes)."""
        blocks = split_evenly(len(pieces), self.num_dp_groups)
        lo, hi = blocks[self.dp_rank]
        return list(pieces[lo:hi]), max(1, max(b - a for a, b in blocks)) if self.distributed else hi - lo

    def gather(self, mine: list) -> list:
        """Every data-parallel group's `mine` (its block's results, in block order), concatenated in group order,
        on every rank (TP rank 0 of each group speaks for it). Collective."""
        if not self.distributed:
            return list(mine)
        everyone = self.all_objects(mine if self.tp_rank == 0 else None)
        return [item for block in everyone[:: self.tp] for item in block]

    def all_objects(self, obj: Any) -> list:
        """`obj` of every rank, in rank order (collective; pickled over the gloo object group)."""
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.object_group)
        return out

    def first_of(self, value: str | None) -> str | None:
        """The first rank's non-None `value` ("... (rank r)"), the same on every rank; None when all are None."""
        if not self.distributed:
            return value
        for rank, found in enumerate(self.all_objects(value)):
            if found is not None:
                return f"{found} (rank {rank})"
        return None

    def sum_(self, t: torch.Tensor, group: Any = "world") -> torch.Tensor:
        """In-place sum over `group` ("world": every rank); a no-op in one process."""
        if self.distributed:
            dist.all_reduce(t, group=None if group == "world" else group)
        return t

    def max_over_tp(self, t: torch.Tensor) -> torch.Tensor:
        """`t` maxed over this rank's tensor-parallel group (each TP rank observes its heads only)."""
        if self.tp_group is not None:
            t = t.float().contiguous()
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.tp_group)
        return t
