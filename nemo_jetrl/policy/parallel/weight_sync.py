"""FP8 refit: every rank quantizes its own FSDP2 shard once, the rollout replicas all-gather FP8 bits + scales.

Under FSDP2 each rank holds a `Shard(0)` (or `Shard(1)`) slice of every master weight W [N, K]. When the slice
boundaries fall on 128-row (column) tile boundaries, quantizing the slice with 128x128 tiles gives exactly the tiles
of quantizing the whole weight, so

    all_gather(weight_quant(local shard))  ==  weight_quant(W)        (bitwise: e4m3 bits and fp32 scales)

and the rollout runs on the very bits the trainer's FProp uses, at ~half the bytes of a BF16 refit
(1 byte per weight + 4 bytes per 128x128 tile). Weights whose shards straddle tiles fall back to gathering the
master and quantizing it (counted in `RefitStats.fallback_weights`). Everything else the rollout needs (embeddings,
norms, lm_head, BF16 layers, biases) is gathered in `other_dtype` (default: the master dtype, exact).

All collectives are batched into flat uint8 buckets (one all-gather per bucket).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from nemo_jetrl.precision.linear import Fp8Linear
from nemo_jetrl.precision.quant import weight_quant
from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear

RefitFormat = Literal["fp8", "bf16"]
DEFAULT_BUCKET_BYTES = 256 << 20
# torch >= 2.13 renamed all_gather_into_tensor (kept as a deprecated alias); the GPU box runs torch 2.11.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class RefitStats:
    """One refit. Bytes are those of the tensors each rank's replica assembles (its TP shard under tensor parallel;
    each rank receives (D-1)/D of them over a data-parallel group of D)."""

    format: str
    num_fp8_weights: int
    fp8_weight_bytes: int  # FP8 bits + scales of the FP8 linears (format "fp8") or their BF16 master ("bf16")
    bf16_weight_bytes: int  # what the same linears cost in BF16
    other_bytes: int  # embeddings, norms, lm_head, BF16 layers, biases
    fallback_weights: int  # FP8 weights whose shards straddle tiles (master gathered instead)
    seconds: float

    def metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in asdict(self).items() if k != "format"}
        out["fp8_vs_bf16_bytes"] = self.fp8_weight_bytes / max(1, self.bf16_weight_bytes)
        return out


def _group_size(group) -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _shard_dim(param: torch.Tensor) -> int | None:
    """The Shard dim of an FSDP2 DTensor parameter, None for a plain (replicated / unsharded) tensor."""
    placements = getattr(param, "placements", None)
    if not placements:
        return None
    dim = getattr(placements[0], "dim", None)
    if dim is None:
        raise ValueError(f"refit supports Shard placements only, got {placements}")
    return int(dim)


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if hasattr(param, "to_local") else param


@dataclass
class _Gather:
    """One tensor to assemble: each rank contributes `local` (padded to `chunk` along `dim`)."""

    local: torch.Tensor
    dim: int
    full_size: int
    chunk: int

    def padded(self) -> torch.Tensor:
        missing = self.chunk - self.local.shape[self.dim]
        if missing == 0:
            return self.local.contiguous()
        shape = list(self.local.shape)
        shape[self.dim] = missing
        return torch.cat([self.local, self.local.new_zeros(shape)], dim=self.dim).contiguous()


def _all_gather(items: list[_Gather], world: int, bucket_bytes: int, group=None) -> list[torch.Tensor]:
    """Assemble every item's full tensor: flat uint8 buckets, one all-gather each."""
    if world == 1:
        return [item.local.narrow(item.dim, 0, item.full_size) for item in items]
    results: list[torch.Tensor | None] = [None] * len(items)
    start = 0
    while start < len(items):
        end, size = start, 0
        while end < len(items) and (end == start or size + _nbytes(items[end]) <= bucket_bytes):
            size += _nbytes(items[end])
            end += 1
        pieces = [items[i].padded() for i in range(start, end)]
        flat = torch.cat([p.view(torch.uint8).reshape(-1) for p in pieces])  # [L] this rank's bytes
        out = flat.new_empty(world, flat.numel())  # [W, L]
        _ALL_GATHER(out.view(-1), flat, group=group)
        offset = 0
        for i, piece in zip(range(start, end), pieces):
            n = piece.numel() * piece.element_size()
            chunks = [out[r, offset : offset + n].view(piece.dtype).view(piece.shape) for r in range(world)]
            results[i] = torch.cat(chunks, dim=items[i].dim).narrow(items[i].dim, 0, items[i].full_size)
            offset += n
        start = end
    return results


def _nbytes(item: _Gather) -> int:
    shape = list(item.local.shape)
    shape[item.dim] = item.chunk
    return int(torch.Size(shape).numel()) * item.local.element_size()


def _gather_item(param: torch.Tensor, dtype: torch.dtype | None, world: int, dest: torch.Tensor) -> _Gather:
    """`dest`: the replica tensor the gathered one fills (with tensor parallel: this TP rank's shard)."""
    dim = _shard_dim(param)
    local = _local(param).detach()
    if dtype is not None:
        local = local.to(dtype)
    full_size = dest.shape[dim]
    return _Gather(local, dim, full_size, -(-full_size // world))


class Fp8Refit:
    """Refit plan between a (possibly FSDP2-sharded) policy and its rollout replica; built once, run per step.

    `refit()` is collective: every rank of `group` (the data-parallel group; default: every rank) calls it, in the
    same order. With tensor parallel the replica holds this TP rank's shards (`build_tp_rollout_replica`): the
    gather runs over the DP group only, and with one DP rank each rank quantizes its TP shard with no gather.
    """

    def __init__(
        self,
        train_model: nn.Module,
        replica: nn.Module,
        *,
        other_dtype: torch.dtype | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group=None,
    ) -> None:
        self.other_dtype, self.group = other_dtype, group
        self.bucket_bytes = int(bucket_bytes)
        self.fp8: list[tuple[str, Fp8Linear, Fp8RolloutLinear]] = []
        fp8_weight_ids = set()
        for name, module in train_model.named_modules():
            if isinstance(module, Fp8Linear) and module.rollout_fp8:
                target = replica.get_submodule(name)
                if not isinstance(target, Fp8RolloutLinear):
                    raise ValueError(f"refit: replica module {name!r} is {type(target).__name__}, not Fp8RolloutLinear")
                self.fp8.append((name, module, target))
                fp8_weight_ids.add(f"{name}.weight")
        replica_tensors = dict(replica.named_parameters()) | dict(replica.named_buffers())
        self.other: list[tuple[str, nn.Parameter, torch.Tensor]] = []
        for name, param in train_model.named_parameters():
            if name in fp8_weight_ids:
                continue
            if name not in replica_tensors:
                raise ValueError(f"refit: the rollout replica has no tensor named {name!r}")
            self.other.append((name, param, replica_tensors[name]))

    @torch.no_grad()
    def refit(self, fmt: RefitFormat = "fp8") -> RefitStats:
        """Quantize local shards (fmt "fp8") or ship the BF16 master (fmt "bf16", the baseline) into the replica."""
        if fmt not in ("fp8", "bf16"):
            raise ValueError(f"refit format must be 'fp8' or 'bf16', got {fmt!r}")
        t0 = time.perf_counter()
        world = _group_size(self.group)
        items: list[_Gather] = []
        plan: list[tuple] = []  # how to use the gathered tensors, in order
        fp8_bytes = bf16_bytes = other_bytes = fallback = 0
        for _name, module, target in self.fp8:
            weight, recipe = module.weight, module.recipe
            if not recipe.layout.features.sharded_refit:  # config validation refuses it first (precision/config.py)
                raise ValueError(f"the FP8 refit gathers 128x128 tiles; fp8_recipe {recipe.granularity!r} has none")
            block, pow2 = recipe.block_size, recipe.pow2_weight_scales
            bf16_bytes += target.weight_fp8.numel() * 2  # per rank: this TP rank's shard
            dim = _shard_dim(weight)
            if fmt == "bf16":
                if dim is not None:
                    items.append(_gather_item(weight, torch.bfloat16, world, target.weight_fp8))
                full = _local(weight).detach().to(torch.bfloat16) if dim is None else None
                plan.append(("quantize", target, full, block, pow2))
                fp8_bytes += target.weight_fp8.numel() * 2
                continue
            chunk = -(-target.weight_fp8.shape[dim] // world) if dim is not None else 0
            if dim is not None and chunk % block:
                fallback += 1
                items.append(_gather_item(weight, None, world, target.weight_fp8))
                plan.append(("quantize", target, None, block, pow2))
                fp8_bytes += target.weight_fp8.numel() * weight.element_size()
                continue
            if dim is None:  # not sharded: quantize the whole weight here (== Fp8Linear.quantized_weight)
                data, scale = weight_quant(_local(weight).detach(), block, pow2)
                plan.append(("load", target, data, scale))
            else:
                data, scale = weight_quant(_local(weight).detach(), block, pow2)  # this rank's tiles only
                items.append(_Gather(data, dim, target.weight_fp8.shape[dim], chunk))
                items.append(_Gather(scale, dim, target.weight_scale.shape[dim], chunk // block))
                plan.append(("gathered_fp8", target))
            fp8_bytes += target.weight_fp8.numel() + target.weight_scale.numel() * 4
        for _name, param, dest in self.other:
            dtype = self.other_dtype or param.dtype
            other_bytes += dest.numel() * torch.empty((), dtype=dtype).element_size()
            if _shard_dim(param) is None:
                plan.append(("copy", dest, _local(param).detach()))
            else:
                items.append(_gather_item(param, self.other_dtype, world, dest))
                plan.append(("copy", dest, None))
        gathered = iter(_all_gather(items, world, self.bucket_bytes, self.group))
        for step in plan:
            kind = step[0]
            if kind == "load":
                step[1].load(step[2], step[3])
            elif kind == "gathered_fp8":
                data, scale = next(gathered), next(gathered)
                step[1].load(data, scale)
            elif kind == "quantize":
                _, target, full, block, pow2 = step
                full = full if full is not None else next(gathered)
                target.load(*weight_quant(full.detach(), block, pow2))
            else:  # copy
                _, dest, full = step
                dest.copy_(full if full is not None else next(gathered))
        if any(True for _ in gathered):
            raise RuntimeError("refit: gathered more tensors than planned (internal error)")
        if self.fp8 and self.fp8[0][2].weight_fp8.is_cuda:
            torch.cuda.synchronize()  # the time covers the transfers, not just their launch
        return RefitStats(fmt, len(self.fp8), fp8_bytes, bf16_bytes, other_bytes, fallback, time.perf_counter() - t0)
