"""A trainer laid out by its parallel plan: the module every forward enters, the model the colocated rollout runs
on, the refit between them; and the trainer's state in the one-process layout (checkpoints move between plans).

plan "none": the logprob root over the model itself; the rollout runs on the trainer's own modules.
plan "fsdp": a rollout replica (`precision.rollout_layers`), the FP8 linears' masters sharded with their bits
  gathered once a step (`fp8_gather.py`), FSDP2 over the rest (`fsdp.shard_policy`), the FP8 refit over every rank.
plan "fsdp_tp": the TP rollout replica, the decoder tensor-parallel (`tensor_parallel.py`), FSDP2 over dp, the
  refit over dp (the master is all-gathered in the trainer's forwards as FSDP2 does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from nemo_jetrl.models.scoring import PolicyLogprobs
from nemo_jetrl.policy.parallel.fp8_gather import shard_fp8_linears
from nemo_jetrl.policy.parallel.fsdp import GatherCounter, shard_policy
from nemo_jetrl.policy.parallel.plan import ParallelPlan
from nemo_jetrl.policy.parallel.tensor_parallel import build_tp_rollout_replica, parallelize_decoder
from nemo_jetrl.policy.parallel.weight_sync import Fp8Refit
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.rollout_layers import build_rollout_replica
from nemo_jetrl.utils.dtensor import full_tensor, local_tensor


@dataclass
class TrainerLayout:
    scorer: PolicyLogprobs  # every trainer forward enters here (the FSDP2 root when sharded)
    rollout_model: nn.Module  # what the colocated rollout engine runs on
    refitter: Fp8Refit | None  # sharded plans: trainer shards -> rollout replica (FP8 bits + the rest)
    counter: GatherCounter | None  # bytes FSDP2's all-gathers assemble (sharded plans)


def lay_out_trainer(
    model: nn.Module, plan: ParallelPlan, recipe: PrecisionRecipe, **scorer_kwargs: Any
) -> TrainerLayout:
    """Shard `model` (FP8-converted, unsharded, the same on every rank) in place as `plan` says.
    scorer_kwargs: `PolicyLogprobs`'s (temperature, compute_dtype, kernels)."""
    if plan.kind == "none":
        return TrainerLayout(PolicyLogprobs(model, **scorer_kwargs), model, None, None)
    ignored: set[nn.Parameter] = set()
    if plan.kind == "fsdp":
        replica = build_rollout_replica(model)
        ignored = shard_fp8_linears(model, replica, plan.dp_mesh, recipe.block_size)
    else:  # this TP rank's rollout shard (from the unsharded weights), then the trainer's TP plan
        try:
            replica = build_tp_rollout_replica(model, plan.tp_rank, plan.tp, plan.tp_group, recipe.block_size)
        except ValueError as exc:  # heads or FP8 tiles that T cannot split
            raise ValueError(f"policy.dtensor_cfg.tensor_parallel_size: {exc}") from None
        parallelize_decoder(model, plan.mesh["tp"], recipe.block_size)
    counter = GatherCounter()
    scorer = shard_policy(
        model, block=recipe.block_size, mesh=plan.dp_mesh, ignored=ignored, counter=counter, **scorer_kwargs
    )
    return TrainerLayout(scorer, replica, Fp8Refit(model, replica, group=plan.dp_group), counter)


# ---------------------------------------------------------------------------------------------------- state
def full_state(model: nn.Module, optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any]:
    """Collective: {"model", "optimizer"} with full CPU tensors (the one-process layout) where `keep` (rank 0);
    the other ranks take part in the gathers and get {}."""
    model_sd = {k: _to_cpu(full_tensor(v), keep) for k, v in model.state_dict().items()}
    opt_sd = optimizer.state_dict()
    state = {i: {k: _to_cpu(full_tensor(v), keep) for k, v in s.items()} for i, s in opt_sd["state"].items()}
    if not keep:
        return {}
    return {"model": model_sd, "optimizer": {"state": state, "param_groups": opt_sd["param_groups"]}}


def _to_cpu(t: Any, keep: bool) -> Any:
    return t.detach().cpu() if keep and isinstance(t, torch.Tensor) else t


@torch.no_grad()
def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load a full state (either layout's checkpoint) keeping this rank's shards (no communication)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state["model"]))
    if missing:
        raise ValueError(f"checkpoint lacks model tensors {missing[:5]}{'...' if len(missing) > 5 else ''}")
    for name, dest in own.items():
        local_tensor(dest).copy_(shard_of(state["model"][name], dest))
    params = [p for group in optimizer.param_groups for p in group["params"]]  # the state's numbering
    opt_state = {}
    for i, s in state["optimizer"]["state"].items():
        p = params[int(i)]
        opt_state[int(i)] = {k: _like_param(v, p) for k, v in s.items()}
    optimizer.load_state_dict({"state": opt_state, "param_groups": state["optimizer"]["param_groups"]})


def shard_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's slice of `full` for a tensor shaped like `like`: its DTensor placements (FSDP2 Shard(d), chunk =
    ceil(n/W); under TP the (dp, tp) placements), cut locally with no communication."""
    if not getattr(like, "placements", None):
        return full
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()


def _like_param(value: Any, param: torch.Tensor) -> Any:
    """Optimizer state entry for `param`: tensors shaped like it become DTensors of this rank's shard."""
    if not isinstance(value, torch.Tensor) or value.shape != param.shape or not hasattr(param, "placements"):
        return value
    local = shard_of(value, param).to(param.device)
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )
