"""FSDP for the FP8 linears on the FP8 bits: master shards on the ranks, ONE all-gather of FP8 bits + scales per
optimizer step, read by the trainer's forward and backward and by the rollout alike.

Under plain FSDP2 every trainer forward (each logprob micro-batch, each training micro-batch, and again in its
backward) all-gathers the linears' master weights (4 bytes a weight in FP32) only to quantize them to FP8 right
after. Here each FP8 linear of a decoder layer keeps its master as a `Shard(d)` DTensor on the data-parallel mesh
(d tile-aligned: `fsdp.tile_aligned_placement`), the refit (`weight_sync.Fp8Refit`) quantizes the shard once and
all-gathers bits + scales into the rollout replica's `Fp8RolloutLinear` (1 byte a weight + 4 per 128x128 tile, the
same bits as quantizing the whole master), and the trainer's `Fp8Linear` reads that very `QuantizedWeight`
(`GatheredFp8Weight`, its `weight_source`): FProp and DGrad run on the gathered bits, and the whole weight gradient
WGrad computes is reduce-scattered (sum) into this rank's shard in the backward (`_ScatterGradToShard`), as
FSDP2's own reduce-scatter does. The bits serve every forward until the next optimizer step; the trainer marks them
stale after a step and gathers again before its next forward or rollout (`NativePolicy`).

torchao's float8 FSDP2 path (`fsdp_pre_all_gather` / `fsdp_post_all_gather` on a weight subclass) gathers FP8 in
every forward instead; with a colocated rollout that holds the whole FP8 weights anyway, one gather a step is the
cheaper contract (the trainer keeps no second FP8 copy; see docs/cluster.md for what stays on FSDP2).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor

from nemo_jetrl.policy.parallel.fsdp import tile_aligned_placement
from nemo_jetrl.precision.layer_map import decoder_layer_index
from nemo_jetrl.precision.linear import Fp8Linear, QuantizedWeight
from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear

# torch >= 2.13 renamed reduce_scatter_tensor (kept as a deprecated alias); the GPU box runs torch 2.11.
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _ScatterGradToShard(torch.autograd.Function):
    """Forward: a zero-storage [N, K] stand-in of the whole weight (the FP8 GEMMs read the gathered bits, not it).
    Backward: the whole gradient [N, K], summed over the group and cut to this rank's `Shard(dim)` chunk."""

    @staticmethod
    def forward(ctx, local, full_shape, dim, group, world):
        ctx.dim, ctx.group, ctx.world, ctx.local_size = dim, group, world, local.shape[dim]
        return local.new_zeros((1,) * len(full_shape)).expand(full_shape)

    @staticmethod
    def backward(ctx, grad):
        dim, world = ctx.dim, ctx.world
        full = grad.shape[dim]
        chunk = -(-full // world)
        moved = grad.movedim(dim, 0)  # [N', ...] the shard dim first
        if chunk * world != full:
            moved = torch.cat([moved, moved.new_zeros(chunk * world - full, *moved.shape[1:])])
        moved = moved.contiguous()
        out = moved.new_empty(chunk, *moved.shape[1:])
        _REDUCE_SCATTER(out, moved, group=ctx.group)
        return out[: ctx.local_size].movedim(0, dim), None, None, None, None


class GatheredFp8Weight:
    """`Fp8Linear.weight_source` of a linear whose master is a shard: the replica layer's gathered FP8 bits."""

    def __init__(self, target: Fp8RolloutLinear, dim: int, group, world: int) -> None:
        self.target, self.dim, self.group, self.world = target, int(dim), group, int(world)

    def quantized_weight(self) -> QuantizedWeight:
        return self.target.quantized_weight()

    def autograd_weight(self, local: torch.Tensor) -> torch.Tensor:
        shape = tuple(self.target.weight_fp8.shape)
        return _ScatterGradToShard.apply(local, shape, self.dim, self.group, self.world)


def gatherable(module: nn.Module, name: str, world: int, block: int) -> int | None:
    """The shard dim of a decoder-layer linear trained and rolled out in FP8 whose shards are whole 128-tiles on
    `world` ranks (so the refit gathers its FP8 bits), else None (it stays on FSDP2's master all-gather)."""
    if not (isinstance(module, Fp8Linear) and module.train_fp8 and module.rollout_fp8):
        return None
    if decoder_layer_index(name) is None or hasattr(module.weight, "placements"):
        return None
    if not module.recipe.layout.features.sharded_refit:
        return None
    dim = tile_aligned_placement(module.weight, world, block).dim
    return dim if (-(-module.weight.shape[dim] // world)) % block == 0 else None


def shard_fp8_linears(model: nn.Module, replica: nn.Module, mesh, block: int = 128) -> set[nn.Parameter]:
    """Make every `gatherable` linear's master a `Shard(d)` DTensor on `mesh` (each rank keeps its chunk of the
    identical full weight, no communication) whose FP8 bits come from `replica` (after each refit); returns the new
    parameters (FSDP2 must leave them alone: `fsdp.shard_policy(ignored=...)`)."""
    world, group = mesh.size(), mesh.get_group()
    sharded = set()
    for name, module in list(model.named_modules()):
        dim = gatherable(module, name, world, block)
        if dim is None:
            continue
        target = replica.get_submodule(name)
        if not isinstance(target, Fp8RolloutLinear):
            raise ValueError(f"fp8 gather: replica module {name!r} is {type(target).__name__}, not Fp8RolloutLinear")
        shard = distribute_tensor(module.weight.detach(), mesh, [Shard(dim)], src_data_rank=None)
        module.weight = nn.Parameter(shard, requires_grad=module.weight.requires_grad)
        module.invalidate_quantized_weight()
        module.weight_group = None  # its bits are the replica's (one buffer per sibling group there)
        module.weight_source = GatheredFp8Weight(target, dim, group, world)
        sharded.add(module.weight)
    for module in model.modules():  # a sibling group with a gathered member: every member reads its own bits
        group_of = getattr(module, "weight_group", None)
        if group_of is not None and any(m.weight_source is not None for m in group_of.members):
            for member in group_of.members:
                member.weight_group = None
    return sharded
