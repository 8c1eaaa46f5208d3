"""One rank of the hybrid layout: an FSDP2 shard of the FP8 trainer and a full rollout engine on refit FP8 weights;
with tensor parallel (`policy.dtensor_cfg.tensor_parallel_size` T > 1), one rank of a (dp, tp) mesh: a TP shard of
the trainer (FSDP2 over dp) and the rollout replica of this TP rank (distributed/tensor_parallel.py).

The GRPO driver never sees this class directly: Ray workers (`worker.py`) hold one each; `bench_fsdp_refit.py`
drives it under torchrun. Every method that touches the sharded trainer is collective (all ranks, same order,
same number of forwards: `num_steps` pads with dummy micro-batches whose loss is multiplied by zero). Under TP the
ranks of one TP group get the same rows; rank r is TP rank r % T of data-parallel group r // T.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor

from nemo_jetrl.distributed.data_split import generate_seed_shards
from nemo_jetrl.distributed.fsdp import clip_grad_norm, invalidate_fp8_caches, shard_policy
from nemo_jetrl.distributed.kv_sync import gather_qkv_records, scales_from_records
from nemo_jetrl.distributed.tensor_parallel import (
    build_tp_rollout_replica,
    parallelize_decoder,
    reduce_head_local_grads,
)
from nemo_jetrl.distributed.weight_sync import Fp8Refit, RefitFormat
from nemo_jetrl.generation.build import engine_kwargs
from nemo_jetrl.generation.interfaces import GenerationOutput
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.scheduler import engine_budget_kwargs
from nemo_jetrl.models.batch_invariant import match_kernels
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.policy.interfaces import LossFunction, TrainBatch, metrics_to_floats
from nemo_jetrl.policy.lr_scheduler import build_lr_scheduler
from nemo_jetrl.policy.trainer_setup import DTYPES, build_optimizer, trainer_kernels
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.kv import KVScales, QKVCalibrator, make_attn_hook
from nemo_jetrl.precision.rollout_layers import build_rollout_replica
from nemo_jetrl.utils.checkpoint import first_nonfinite


class DataParallelPolicy:
    """Trainer shard + rollout engine of one rank. `model` is an unsharded HF causal LM in the master dtype."""

    def __init__(
        self,
        model: nn.Module,
        *,
        policy_cfg: Mapping[str, Any],
        init_reference_model: bool = False,
        recipe: PrecisionRecipe,
        device: torch.device,
        pad_token_id: int,
        stop_token_ids: Sequence[int],
        other_dtype: torch.dtype | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise ValueError("DataParallelPolicy needs torch.distributed to be initialized")
        self.cfg, self.recipe, self.device = policy_cfg, recipe, device
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.tp = int(policy_cfg.get("dtensor_cfg", {}).get("tensor_parallel_size", 1))
        if self.world_size % self.tp:
            raise ValueError(
                f"policy.dtensor_cfg.tensor_parallel_size ({self.tp}) must divide the ranks ({self.world_size})"
            )
        # (dp, tp) mesh, TP groups of consecutive ranks; None without TP (FSDP2 over every rank, refit over all)
        self.mesh = None
        if self.tp > 1:
            self.mesh = init_device_mesh(
                device.type, (self.world_size // self.tp, self.tp), mesh_dim_names=("dp", "tp")
            )
        self.tp_rank = self.mesh["tp"].get_local_rank() if self.mesh is not None else 0
        self.tp_group = self.mesh["tp"].get_group() if self.mesh is not None else None
        self.dp_group = self.mesh["dp"].get_group() if self.mesh is not None else None
        self.compute_dtype = DTYPES[policy_cfg["compute_dtype"]]
        gen = policy_cfg["generation"]
        self.temperature = float(gen["temperature"])
        self.kernels = trainer_kernels(policy_cfg)
        self.reference_model = None
        if init_reference_model:  # before the FP8 swap, as NativePolicy
            self.reference_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.layer_map = convert_to_fp8(model, recipe) if recipe.any_fp8 else {}
        if gen["matched_kernels"] is True:  # before the replica, which copies the switch (auto is off on Ray)
            match_kernels(model, device)
        self.model = model.train()
        if self.mesh is None:
            self.replica = build_rollout_replica(model)
        else:  # this TP rank's rollout shard (from the unsharded weights), then the trainer's TP plan
            try:
                self.replica = build_tp_rollout_replica(model, self.tp_rank, self.tp, self.tp_group, recipe.block_size)
            except ValueError as exc:  # heads or FP8 tiles that T cannot split
                raise ValueError(f"policy.dtensor_cfg.tensor_parallel_size: {exc}") from None
            parallelize_decoder(model, self.mesh["tp"], recipe.block_size)
        self.module = shard_policy(
            model,
            temperature=self.temperature,
            compute_dtype=self.compute_dtype,
            block=recipe.block_size,
            mesh=self.mesh["dp"] if self.mesh is not None else None,
            kernels=self.kernels,
        )
        self.optimizer = build_optimizer(model.parameters(), policy_cfg["optimizer"])
        self.lr_scheduler = build_lr_scheduler(self.optimizer, policy_cfg["scheduler"])
        self.refitter = Fp8Refit(model, self.replica, other_dtype=other_dtype, group=self.dp_group)
        self.engine = NativeGenerationEngine(
            self.replica,
            **engine_kwargs(policy_cfg, stop_token_ids, pad_token_id, self.compute_dtype),
            cuda_graphs=bool(gen["cuda_graphs"]),
            device=device,
            **engine_budget_kwargs(gen),
        )
        # FP8 KV cache: this rank's per-chunk Q/K/V amax records of the last calibrating logprob pass, and the
        # scales the rollout (and, with train_kv_fake_quant, the trainer's attention) runs with (see kv_sync).
        self.num_layers = int(model.config.num_hidden_layers)
        self.kv_scales: KVScales | None = None
        self._kv_records: list[torch.Tensor] = []
        self.step = 0

    # ------------------------------------------------------------------ rollout
    def generate(
        self, shards: Sequence[tuple[list[list[int]], int]], greedy: bool, engine_changes: Mapping | None = None
    ) -> list[GenerationOutput]:
        """Run this rank's rollout seed shards on the replica (no collectives without TP; under TP every rank of the
        group runs the same shards, and TP rank 0 alone returns the outputs); outputs on CPU.

        `engine_changes`: constructor changes for this call (e.g. {"kv_cache_dtype": None}, the calibration rollout).
        """
        engine = self.engine.replace(**engine_changes) if engine_changes else self.engine
        outs = generate_seed_shards(engine, shards, greedy=greedy, device=self.device)
        return outs if self.tp_rank == 0 else []

    def refit(self, fmt: RefitFormat = "fp8") -> dict[str, Any]:
        """Collective: quantize this rank's shards once, all-gather FP8 bits + scales into the replica, and the KV
        scales of this step's calibrating pass with them. Metrics, plus "kv_scales" (CPU KVScales) when new. The
        step's gradients are freed first: the rollout and the next logprob pass get their memory."""
        self.optimizer.zero_grad(set_to_none=True)
        out: dict[str, Any] = self.refitter.refit(fmt).metrics()
        if self.recipe.kv_fp8:
            out.update(self.finish_kv_calibration())
        return out

    # ------------------------------------------------------------------ FP8 KV scales
    def _attn_hook(self, calibrator: QKVCalibrator | None, strict: bool = True):
        """As NativePolicy._attn_hook: observe Q/K/V (calibration) and/or fake-quantize K/V with the rollout scales.

        strict=False (the first calibration) runs without fake-quant while there are no scales yet."""
        fake = self.kv_scales if self.recipe.train_kv_fake_quant else None
        if strict and fake is None and self.recipe.train_kv_fake_quant and self.recipe.kv_fp8:
            raise ValueError("train_kv_fake_quant needs KV scales first: call calibrate_kv / set_kv_scales")
        return make_attn_hook(calibrator, fake)

    def finish_kv_calibration(self) -> dict[str, Any]:
        """Collective: scales from every rank's records of the last calibrating pass; {} when nobody recorded."""
        t0 = time.perf_counter()
        records = gather_qkv_records(self._kv_records, group=self.dp_group)  # TP ranks hold the same (maxed) ones
        self._kv_records = []
        if not records:
            return {}
        scales = scales_from_records(records, self.num_layers, self.recipe.kv_calibration, self.device)
        self.set_kv_scales(scales)
        metrics = {f"kv_{k}": v for k, v in scales.metrics().items()}
        return {"kv_calibration_s": time.perf_counter() - t0, **metrics, "kv_scales": scales.to("cpu")}

    def set_kv_scales(self, scales: KVScales) -> None:
        """The scales the rollout engine (and the trainer's K/V fake-quant) use from now on."""
        self.kv_scales = scales.to(self.device)
        self.engine.update_weights(kv_scales=self.kv_scales.kv)

    def set_engine_kv_scales(self, k_scales: torch.Tensor, v_scales: torch.Tensor) -> None:
        self.engine.update_weights(kv_scales=(k_scales.to(self.device), v_scales.to(self.device)))

    def calibrate_kv(self, chunks: Sequence[TrainBatch], num_steps: int, dummy: TrainBatch) -> KVScales:
        """Collective: a calibrating no-grad pass over `chunks`, then new scales (as NativePolicy.calibrate_kv_scales)."""
        self.logprobs(chunks, num_steps, dummy, calibrate=True, strict=False)
        return self.finish_kv_calibration()["kv_scales"]

    # ------------------------------------------------------------------ logprobs
    @torch.no_grad()
    def logprobs(
        self,
        chunks: Sequence[TrainBatch],
        num_steps: int,
        dummy: TrainBatch,
        calibrate: bool = False,
        strict: bool = True,
    ) -> list[torch.Tensor] | None:
        """Collective: per-token logprobs of this rank's logprob chunks, one [b, w] per chunk (`num_steps` forwards
        in all; chunks may differ in width under dynamic batching); under TP, TP rank 0 alone returns them (the
        others None).

        `calibrate`: record each real chunk's per-layer Q/K/V amax for the next `finish_kv_calibration` (under TP,
        the max over the TP group: every head's).
        `strict`: see `_attn_hook`.
        """
        if len(chunks) > num_steps:
            raise ValueError(f"logprobs: {len(chunks)} chunks exceed num_steps={num_steps}")
        if calibrate:
            self._kv_records = []
        self.module.eval()
        out = []
        for i in range(num_steps):
            real = i < len(chunks)
            mb = (chunks[i] if real else dummy).to(self.device)
            calibrator = QKVCalibrator(self.num_layers, self.recipe.kv_calibration) if real and calibrate else None
            hook = self._attn_hook(calibrator, strict)
            logp = self.module(mb.input_ids, mb.attention_mask, attn_hook=hook)  # [b, S]
            if real:
                out.append(logp.cpu())
            if calibrator is not None:
                amax = calibrator.amax()  # this forward's [L, 3] over this rank's heads
                if self.tp_group is not None:
                    amax = amax.float().contiguous()
                    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.tp_group)
                self._kv_records.append(amax)
        self.module.train()
        return out if self.tp_rank == 0 else None

    @torch.no_grad()
    def reference_logprobs(self, rows: TrainBatch) -> torch.Tensor:
        """Logprobs [b, S] under the frozen reference (a full copy on every rank; no collectives)."""
        if self.reference_model is None:
            raise RuntimeError("reference logprobs need loss_fn.reference_policy_kl_penalty > 0")
        mbs = int(self.cfg["logprob_batch_size"])
        out = []
        for s in range(0, len(rows), mbs):
            mb = rows.select(slice(s, s + mbs)).to(self.device)
            out.append(
                sequence_logprobs(
                    self.reference_model,
                    mb.input_ids,
                    mb.attention_mask,
                    temperature=self.temperature,
                    compute_dtype=self.compute_dtype,
                    **self.kernels,
                )
                .float()
                .cpu()
            )
        return torch.cat(out)

    # ------------------------------------------------------------------ training
    def train(
        self,
        micro_batches: Sequence[TrainBatch],
        num_steps: int,
        normalizer: float,
        dummy: TrainBatch,
        loss_fn: LossFunction,
    ) -> dict[str, Any]:
        """Collective optimizer step. Returns this rank's per-micro-batch metrics, the global grad norm and lr;
        or, when the global gradient is not finite, {"nonfinite": what, "step"} with the step skipped on all ranks."""
        if len(micro_batches) > num_steps:
            raise ValueError(f"train: {len(micro_batches)} micro-batches exceed num_steps={num_steps}")
        for mb in (*micro_batches, dummy):
            if mb.prev_logprobs is None:
                raise ValueError("train() needs batch.prev_logprobs (call get_logprobs first)")
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        per_mb, losses = [], []  # every rank must finish the collectives: decide after the backward passes
        for i in range(num_steps):
            real = i < len(micro_batches)
            mb = (micro_batches[i] if real else dummy).to(self.device)
            logp = self.module(mb.input_ids, mb.attention_mask, attn_hook=self._attn_hook(None))  # [b, S]
            loss, metrics = loss_fn(logp, mb, normalizer)
            (loss if real else loss * 0.0).backward()
            if real:  # read after the loop, in one host sync
                per_mb.append(metrics)
                losses.append({"loss": loss.detach()})
        resolved = metrics_to_floats(per_mb + losses)
        per_mb, losses = resolved[: len(per_mb)], [v["loss"] for v in resolved[len(per_mb) :]]
        bad = [(i, v) for i, v in enumerate(losses) if not math.isfinite(v)]
        nonfinite = f"loss (rank {self.rank}, micro-batch {bad[0][0]}, value {bad[0][1]})" if bad else None
        if self.tp_group is not None:  # q_norm / k_norm saw this rank's heads only
            reduce_head_local_grads(self.model, self.tp_group)
        grad_norm = clip_grad_norm(self.model.parameters(), self.cfg["max_grad_norm"])
        if not torch.isfinite(torch.tensor(grad_norm)):  # the global norm: every rank takes this branch together
            self.optimizer.zero_grad(set_to_none=True)
            return {"nonfinite": nonfinite or f"gradient (grad norm {grad_norm})", "step": self.step}
        self.optimizer.step()
        invalidate_fp8_caches(self.model)
        self.step += 1
        out = {"micro_batch_metrics": per_mb, "grad_norm": grad_norm, "lr": self.optimizer.param_groups[0]["lr"]}
        bad = first_nonfinite({f"master weight {n}": _local_of(p.detach()) for n, p in self.model.named_parameters()})
        if bad is not None:  # this rank's shards after the step (the driver stops the run)
            out["nonfinite_state"] = f"{bad} (rank {self.rank})"
        return out

    def step_lr_scheduler(self) -> float:
        """Once per GRPO step, after its optimizer steps (as NativePolicy.train); returns the next lr."""
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ state (single-process format)
    def full_state_dict(self) -> dict[str, Any]:
        """Collective: {"model", "optimizer", "step"} with full CPU tensors, the `NativePolicy.state_dict()` format."""
        model_sd = {k: _full(v) for k, v in self.model.state_dict().items()}
        opt_sd = self.optimizer.state_dict()
        state = {i: {k: _full(v) for k, v in s.items()} for i, s in opt_sd["state"].items()}
        out = {
            "model": model_sd,
            "optimizer": {"state": state, "param_groups": opt_sd["param_groups"]},
            "step": self.step,
        }
        if self.lr_scheduler is not None:
            out["lr_scheduler"] = self.lr_scheduler.state_dict()
        return out

    @torch.no_grad()
    def load_full_state_dict(self, state: Mapping[str, Any]) -> dict[str, float]:
        """Load a full state (either layout's checkpoint), keep this rank's shards, then refit the rollout."""
        own = self.model.state_dict()
        missing = sorted(set(own) - set(state["model"]))
        if missing:
            raise ValueError(f"checkpoint lacks model tensors {missing[:5]}{'...' if len(missing) > 5 else ''}")
        for name, dest in own.items():
            _local_of(dest).copy_(_shard_of(state["model"][name], dest))
        params = [p for group in self.optimizer.param_groups for p in group["params"]]  # the state's numbering
        opt_state = {}
        for i, s in state["optimizer"]["state"].items():
            p = params[int(i)]
            opt_state[int(i)] = {k: _like_param(v, p) for k, v in s.items()}
        self.optimizer.load_state_dict({"state": opt_state, "param_groups": state["optimizer"]["param_groups"]})
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.step = int(state["step"])
        invalidate_fp8_caches(self.model)
        return self.refit()


def _full(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()
    return t


def _local_of(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _shard_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's slice of `full` for a tensor shaped like `like`: its DTensor placements (FSDP2 Shard(d), chunk =
    ceil(n/W); under TP the (dp, tp) placements), cut locally with no communication."""
    if not getattr(like, "placements", None):
        return full
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()


def _like_param(value: Any, param: torch.Tensor) -> Any:
    """Optimizer state entry for `param`: tensors shaped like it become DTensors of this rank's shard."""
    if not isinstance(value, torch.Tensor) or value.shape != param.shape or not hasattr(param, "placements"):
        return value
    from torch.distributed.tensor import DTensor

    local = _shard_of(value, param).to(param.device)
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )
