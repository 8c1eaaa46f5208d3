"""FSDP2 (`fully_shard`) over the policy: every decoder-layer linear is a unit, the rest (embeddings, norms,
lm_head) lives in the root unit; all forwards enter through the root, `PolicyLogprobs`.

Linears are sharded on a tile-aligned dim when one exists (`tile_aligned_placement`) so each rank can quantize its
shard with whole 128x128 tiles (see weight_sync). Gradients are reduced with a plain SUM (`force_sum_reduction`,
divide factor 1): each rank's loss already carries the global normalizer, and gloo has no PREMUL_SUM / AVG.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Shard

from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.precision.layer_map import decoder_layer_index
from nemo_jetrl.precision.linear import Fp8Linear, local_tensor


class PolicyLogprobs(nn.Module):
    """Root FSDP unit: `forward(input_ids [B, S], attention_mask [B, S], attn_hook) -> logprobs [B, S]` (fp32)."""

    def __init__(
        self, model: nn.Module, *, temperature: float, compute_dtype: torch.dtype | None, kernels: Mapping | None
    ) -> None:
        super().__init__()
        self.model = model
        self.kernels = dict(kernels or {})
        self.temperature = float(temperature)
        self.compute_dtype = compute_dtype

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, attn_hook=None) -> torch.Tensor:
        return sequence_logprobs(
            self.model,
            input_ids,
            attention_mask,
            temperature=self.temperature,
            compute_dtype=self.compute_dtype,
            attn_hook=attn_hook,
            **self.kernels,
        ).float()


def tile_aligned_placement(param: torch.Tensor, world_size: int, block: int = 128) -> Shard:
    """Shard(0) if each rank's row chunk is whole tiles, else Shard(1) if its column chunk is, else Shard(0)."""
    if param.dim() == 2:
        rows, cols = param.shape
        if math.ceil(rows / world_size) % block == 0:
            return Shard(0)
        if math.ceil(cols / world_size) % block == 0:
            return Shard(1)
    return Shard(0)


def _sum_reduction(module: FSDPModule) -> None:
    module.set_force_sum_reduction_for_comms(True)
    module.set_gradient_divide_factor(1.0)


def shard_policy(
    model: nn.Module,
    *,
    temperature: float,
    compute_dtype: torch.dtype | None,
    block: int = 128,
    mesh: DeviceMesh | None = None,
    kernels: Mapping | None = None,
) -> PolicyLogprobs:
    """Apply FSDP2 to `model` in place (needs an initialized process group); returns the root to call.
    mesh: the data-parallel mesh (default: every rank); with tensor parallel, the "dp" dim of the (dp, tp) mesh
    the decoder was parallelized on (`tensor_parallel.parallelize_decoder`), and FSDP2 shards each TP shard.
    kernels: `sequence_logprobs` keywords (`policy.trainer_setup.trainer_kernels`)."""
    if not dist.is_initialized():
        raise ValueError("shard_policy needs torch.distributed to be initialized (init_process_group)")
    device_type = next(model.parameters()).device.type
    mesh = mesh if mesh is not None else init_device_mesh(device_type, (dist.get_world_size(),))
    world = mesh.size()
    # Fp8Linear returns `y.reshape(...)` (a view); decoder_forward never writes into projection outputs in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
    units = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | Fp8Linear) and decoder_layer_index(name) is not None:
            placement = lambda p: tile_aligned_placement(local_tensor(p), world, block)  # noqa: E731 - of a TP shard
            fully_shard(module, mesh=mesh, shard_placement_fn=placement)
            _sum_reduction(module)
            units += 1
    if units == 0:
        raise ValueError("shard_policy: the model has no linear layers inside `layers.<i>.` to shard")
    root = PolicyLogprobs(model, temperature=temperature, compute_dtype=compute_dtype, kernels=kernels)
    fully_shard(root, mesh=mesh)
    _sum_reduction(root)
    return root


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float | None) -> float:
    """Global grad norm over (DTensor) grads, clipping to `max_norm` (None = measure only); as a float.

    Grads on different device meshes (tensor parallel: TP-sharded linears on (dp, tp), replicated norms and
    embeddings on dp) are normed per mesh and combined as sqrt(sum of squares)."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    limit = float(max_norm) if max_norm is not None else math.inf
    meshes: dict = {}
    for p in params:
        meshes.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    if len(meshes) == 1:
        return float(_full(torch.nn.utils.clip_grad_norm_(params, limit)))
    squares = [_full(torch.nn.utils.get_total_norm(grads)).float() ** 2 for grads in meshes.values()]
    total = torch.stack(squares).sum().sqrt()
    coef = float(torch.clamp(limit / (total + 1e-6), max=1.0))
    if coef < 1.0:
        for grads in meshes.values():
            torch._foreach_mul_(grads, coef)
    return float(total)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def invalidate_fp8_caches(model: nn.Module) -> int:
    """Drop every Fp8Linear's cached FP8 weight (FSDP2 refills unsharded weights without bumping versions)."""
    n = 0
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            module.invalidate_quantized_weight()
            n += 1
    return n
