"""FSDP2 (`fully_shard`) over the policy: every decoder-layer linear is a unit, the rest (embeddings, norms,
lm_head) lives in the root unit; all forwards enter through the root, `PolicyLogprobs` (models/scoring.py). The
FP8 linears whose bits are gathered once a step (`fp8_gather.py`) are left out (`ignored`).

Linears are sharded on a tile-aligned dim when one exists (`tile_aligned_placement`) so each rank can quantize its
shard with whole 128x128 tiles (see weight_sync). Gradients are reduced with a plain SUM (`force_sum_reduction`,
divide factor 1): each rank's loss already carries the global normalizer, and gloo has no PREMUL_SUM / AVG.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Shard

from nemo_jetrl.models.scoring import PolicyLogprobs
from nemo_jetrl.precision.layer_map import decoder_layer_index
from nemo_jetrl.precision.linear import Fp8Linear
from nemo_jetrl.utils.dtensor import full_tensor, local_tensor


def tile_aligned_placement(param: torch.Tensor, world_size: int, block: int = 128) -> Shard:
    """Shard(0) if each rank's row chunk is whole tiles, else Shard(1) if its column chunk is, else Shard(0)."""
    if param.dim() == 2:
        rows, cols = param.shape
        if math.ceil(rows / world_size) % block == 0:
            return Shard(0)
        if math.ceil(cols / world_size) % block == 0:
            return Shard(1)
    return Shard(0)


def shard_policy(
    model: nn.Module,
    *,
    temperature: float,
    compute_dtype: torch.dtype | None,
    block: int = 128,
    mesh: DeviceMesh | None = None,
    kernels: Mapping | None = None,
    ignored: set[nn.Parameter] | None = None,
    counter: GatherCounter | None = None,
) -> PolicyLogprobs:
    """Apply FSDP2 to `model` in place (needs an initialized process group); returns the root to call.
    mesh: the data-parallel mesh (default: every rank); with tensor parallel, the "dp" dim of the (dp, tp) mesh
    the decoder was parallelized on (`tensor_parallel.parallelize_decoder`), and FSDP2 shards each TP shard.
    kernels: `sequence_logprobs` keywords (`policy.trainer_setup.trainer_kernels`).
    ignored: parameters sharded otherwise (`fp8_gather.shard_fp8_linears`); counter: counts the bytes FSDP2's
    all-gathers assemble."""
    if not dist.is_initialized():
        raise ValueError("shard_policy needs torch.distributed to be initialized (init_process_group)")
    ignored = set(ignored or ())
    device_type = next(model.parameters()).device.type
    mesh = mesh if mesh is not None else init_device_mesh(device_type, (dist.get_world_size(),))
    world = mesh.size()
    # Fp8Linear returns `y.reshape(...)` (a view); decoder_forward never writes into projection outputs in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
    units = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | Fp8Linear) and decoder_layer_index(name) is not None:
            if module.weight in ignored:
                continue
            placement = lambda p: tile_aligned_placement(local_tensor(p), world, block)  # noqa: E731 - of a TP shard
            fully_shard(module, mesh=mesh, shard_placement_fn=placement)
            units.append(module)
    if not units and not ignored:
        raise ValueError("shard_policy: the model has no linear layers inside `layers.<i>.` to shard")
    root = PolicyLogprobs(model, temperature=temperature, compute_dtype=compute_dtype, kernels=kernels)
    fully_shard(root, mesh=mesh, ignored_params=ignored or None)
    for unit in (*units, root):
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no AVG / PREMUL_SUM; losses carry the normalizer
        unit.set_gradient_divide_factor(1.0)
        if counter is not None:
            counter.attach(unit)
    return root


def total_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of `grads` (DTensor shards or plain tensors) as a float32 0-d tensor, without a host
    sync: squares summed in float64 (each shard's, then over the ranks of its device mesh; tensor parallel puts
    TP-sharded linears on (dp, tp) and the replicated rest on dp) and rounded to float32 once, so one process and
    any sharding of the same gradients give the same norm (the float64 sums differ in their last bits only)."""
    meshes: dict = {}
    for g in grads:
        meshes.setdefault(getattr(g, "device_mesh", None), []).append(g)
    squares = []
    for mesh, group in meshes.items():
        if mesh is not None and any(not isinstance(p, Shard) for p in group[0].placements):
            squares.append(full_tensor(torch.nn.utils.get_total_norm(group)).double() ** 2)  # replicated dims
            continue
        sq = torch.stack(_float64_norms([local_tensor(g) for g in group])).square().sum()
        if mesh is not None:
            dist.all_reduce(sq, group=mesh.get_group() if mesh.ndim == 1 else None)
        squares.append(sq)
    if not squares:
        return torch.zeros(())
    return torch.stack(squares).sum().sqrt().float()


def _float64_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's L2 norm accumulated in float64 (one foreach launch where this torch has it)."""
    try:
        return list(torch._foreach_norm(tensors, 2, dtype=torch.float64))
    except (TypeError, RuntimeError):  # an older foreach_norm without `dtype`
        return [torch.linalg.vector_norm(t, dtype=torch.float64) for t in tensors]


def clip_grads(grads: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Scale `grads` in place by min(1, max_norm / (total + 1e-6)) (`clip_grads_with_norm_`; DTensor shards
    scaled through their local tensors, so any mix of meshes takes one coefficient)."""
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    locals_ = [local_tensor(g) for g in grads]
    torch._foreach_mul_(locals_, coef.to(locals_[0].device) if locals_ else coef)


class GatherCounter:
    """Bytes the FSDP2 all-gathers of the units it is attached to assemble (each rank's output buffers), through
    FSDP2's custom all-gather hook (`set_custom_all_gather`); `take()` returns and resets the count."""

    def __init__(self) -> None:
        self.bytes = 0
        self.supported = _COUNTING_ALL_GATHER is not None

    def attach(self, unit: FSDPModule) -> None:
        """Count `unit`'s all-gathers; where this torch's FSDP2 takes no custom all-gather, count nothing at all
        (`supported` turns false and the trainer logs no FSDP2 bytes)."""
        if not self.supported:
            return
        try:
            unit.set_custom_all_gather(_COUNTING_ALL_GATHER(self))
        except (AttributeError, TypeError, ValueError):
            self.supported = False

    def take(self) -> int:
        n, self.bytes = self.bytes, 0
        return n


def _counting_all_gather():
    """An FSDP2 `AllGather` comm that counts its output bytes, or None where this torch has no such hook."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather
    except ImportError:
        return None
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    class CountingAllGather(AllGather):
        def __init__(self, counter: GatherCounter) -> None:
            self.counter = counter

        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            self.counter.bytes += output_tensor.numel() * output_tensor.element_size()
            return gather(output_tensor, input_tensor, group=group, async_op=async_op)

    return CountingAllGather


_COUNTING_ALL_GATHER = _counting_all_gather()
