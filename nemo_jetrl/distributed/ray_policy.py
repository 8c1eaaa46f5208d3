"""The GRPO driver's view of a Ray worker group: a `PolicyInterface` and a `GenerationInterface`.

Both split the global batch as `data_split` describes and gather the results, so the driver's step code is the
same as in a single process. Metrics are combined exactly as `NativePolicy.train` combines its micro-batches.
With tensor parallel (`policy.dtensor_cfg.tensor_parallel_size` T) the split is over the W / T data-parallel groups:
the T ranks of a group get the same rows and one result per group is read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.data_split import (
    assign_contiguous,
    group_leaders,
    merge_generation_outputs,
    per_rank,
    seed_shards,
    split_evenly,
)
from nemo_jetrl.distributed.worker_group import RayWorkerGroup
from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput
from nemo_jetrl.policy.interfaces import LossFunction, PolicyInterface, TrainBatch, combine_step_metrics
from nemo_jetrl.policy.micro_batches import MicroBatch, plan_micro_batches
from nemo_jetrl.policy.nonfinite import NonFiniteError, NonFiniteStateError
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.kv import KVScales
from nemo_jetrl.utils.checkpoint import first_nonfinite


class RayPolicy(PolicyInterface):
    """Data-parallel FSDP2 trainer on a `RayWorkerGroup` (one shard per worker; under TP, one TP group per
    data-parallel group of T workers)."""

    def __init__(
        self,
        group: RayWorkerGroup,
        cfg: Mapping[str, Any],
        setup_info: Mapping[str, Any],
        *,
        init_reference_model: bool = False,
    ) -> None:
        self.group = group
        self.cfg = cfg["policy"]
        self.tp = int(cfg["policy"]["dtensor_cfg"]["tensor_parallel_size"])
        self.num_dp_groups = group.num_workers // self.tp
        self.recipe = PrecisionRecipe.from_config(cfg["policy"])
        self.tokenizer = setup_info["tokenizer"]
        self.layer_map = dict(setup_info["layer_map"])
        self._has_reference = bool(init_reference_model)  # the frozen reference lives on the workers
        self._parameter_bytes = int(setup_info["parameter_bytes"])
        self.last_refit: dict[str, float] = dict(setup_info.get("refit", {}))
        self.step = 0  # optimizer steps taken (as NativePolicy.step)
        # FP8 KV cache, as NativePolicy: `kv_scales` (KVScales, CPU) = what the rollout runs with; calibrated in the
        # step's logprob pass ("fused") or in a pass over the training batch after the step ("post_step").
        gen = cfg["policy"]["generation"]
        self.kv_scales: KVScales | None = None
        self.kv_calibration_pass = "post_step" if gen["deterministic"] else gen["kv_cache_calibration_pass"]
        self._last_train_batch: TrainBatch | None = None

    @property
    def has_reference(self) -> bool:
        return self._has_reference

    def parameter_bytes(self) -> int:
        return self._parameter_bytes

    # ---------------------------------------------------------------- logprobs
    def _row_split(self, batch: TrainBatch) -> list[TrainBatch | None]:
        return [
            batch.select(slice(lo, hi)) if hi > lo else None
            for lo, hi in split_evenly(len(batch), self.group.num_workers)
        ]

    def _micro_batches(self, batch: TrainBatch, kind: str) -> tuple[list[MicroBatch], list[list[TrainBatch]], int]:
        """The single-process trainer's micro-batches of a `kind` pass (policy/micro_batches.py: fixed rows, or
        dynamic batching's windows), in contiguous blocks per data-parallel group: (the micro-batches in order, one
        list of their batches per worker, the most any group runs)."""
        parts = plan_micro_batches(batch.attention_mask, self.cfg, kind)
        blocks = assign_contiguous(parts, self.num_dp_groups)
        chunks = [[batch.window(p.rows, p.cols) for p in block] for block in blocks]
        return parts, per_rank(chunks, self.tp), max(map(len, blocks))

    def get_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        fused = self.recipe.kv_fp8 and self.kv_calibration_pass == "fused"
        parts, chunks, steps = self._micro_batches(batch, "logprob")
        dummy = batch.select(slice(0, 1))
        results = self.group.run("logprobs", "logprobs", per_worker=[(c, steps, dummy, fused) for c in chunks])
        pieces = [logp for r in group_leaders(results, self.tp) if r is not None for logp in r]  # micro-batch order
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # [B, S]
        for part, logp in zip(parts, pieces, strict=True):
            part.scatter(out, logp)
        return out

    def calibrate_kv_scales(self, batch: TrainBatch) -> KVScales:
        """A calibrating no-grad pass over `batch` on the workers; returns (and sets everywhere) the new scales."""
        if not self.recipe.kv_fp8:
            raise ValueError("calibrate_kv_scales needs policy.generation.kv_cache_dtype: fp8")
        _, chunks, steps = self._micro_batches(batch, "logprob")
        dummy = batch.select(slice(0, 1))
        self.kv_scales = self.group.run(
            "kv_calibration", "calibrate_kv", per_worker=[(c, steps, dummy) for c in chunks]
        )[0]
        return self.kv_scales

    def get_reference_policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if not self._has_reference:
            raise RuntimeError("reference logprobs need loss_fn.reference_policy_kl_penalty > 0")
        results = self.group.run(
            "reference_logprobs", "reference_logprobs", per_worker=[(p,) for p in self._row_split(batch)]
        )
        return torch.cat([r for r in results if r is not None])  # [B, S]

    # ---------------------------------------------------------------- training
    def train(self, batch: TrainBatch | Sequence[TrainBatch], loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step per batch, then one LR-scheduler step on every worker (as NativePolicy.train)."""
        steps = [batch] if isinstance(batch, TrainBatch) else list(batch)
        per_step = [self._optimizer_step(b, loss_fn) for b in steps]
        if self.cfg["scheduler"] is not None:
            self.group.run("lr_scheduler", "step_lr_scheduler")
        post_step = self.kv_calibration_pass == "post_step"
        self._last_train_batch = (steps[0] if len(steps) == 1 else TrainBatch.cat(steps)) if post_step else None
        return combine_step_metrics(per_step)

    def _optimizer_step(self, batch: TrainBatch, loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step over the global batch: the single-process micro-batches, contiguous blocks per worker."""
        if batch.prev_logprobs is None:
            raise ValueError("train() needs batch.prev_logprobs (call get_logprobs first)")
        normalizer = loss_fn.normalizer(batch)
        _, chunks, steps = self._micro_batches(batch, "train")
        dummy = batch.select(slice(0, 1))
        per_worker = [(c, steps, normalizer, dummy, loss_fn) for c in chunks]
        results = self.group.run("train", "train", per_worker=per_worker)
        if "nonfinite" in results[0]:  # all ranks skipped the optimizer step together
            raise NonFiniteError(results[0]["nonfinite"], self.step)
        self.step += 1
        bad = next((r["nonfinite_state"] for r in results if "nonfinite_state" in r), None)
        if bad is not None:
            raise NonFiniteStateError(bad, self.step)
        sums: dict[str, float] = {}
        n_micro = 0
        for result in group_leaders(results, self.tp):  # group order == micro-batch order
            for metrics in result["micro_batch_metrics"]:
                n_micro += 1
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        out = {k: v / n_micro for k, v in sums.items()}
        if "loss" in sums:  # a sum of globally-normalised micro-batch losses, as in NativePolicy.train
            out["loss"] = sums["loss"]
        out.update(grad_norm=results[0]["grad_norm"], lr=results[0]["lr"], num_micro_batches=float(n_micro))
        return out

    def nonfinite_state(self) -> str | None:
        """The KV scales held here (the workers check their weight shards after every optimizer step)."""
        if self.kv_scales is None:
            return None
        return first_nonfinite({f"KV {n} scales": getattr(self.kv_scales, n) for n in ("q", "k", "v")})

    def prepare_refit(self) -> dict[str, float]:
        """Every worker quantizes its shards once; the rollout replicas all-gather FP8 bits + scales, and the KV
        scales of this step's calibration travel with them."""
        kv_metrics: dict[str, float] = {}
        if self.recipe.kv_fp8 and self.kv_calibration_pass == "post_step" and self._last_train_batch is not None:
            t0 = time.perf_counter()
            scales = self.calibrate_kv_scales(self._last_train_batch)
            kv_metrics = {"kv_calibration_s": time.perf_counter() - t0}
            kv_metrics.update({f"kv_{k}": v for k, v in scales.metrics().items()})
        self._last_train_batch = None
        result = dict(self.group.run("refit", "refit")[0])
        scales = result.pop("kv_scales", None)
        if scales is not None:
            self.kv_scales = scales
        self.last_refit = {**result, **kv_metrics}
        return dict(self.last_refit)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Full state in the single-process layout (checkpoints move between local and Ray runs)."""
        state = self.group.run("checkpoint", "full_state_dict")[0]
        if self.kv_scales is not None:  # the next rollout's FP8 KV scales, as NativePolicy.state_dict
            state["kv_scales"] = {n: getattr(self.kv_scales, n).cpu() for n in ("q", "k", "v")}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.group.run("load_checkpoint", "load_full_state_dict", common=(self.group.put(dict(state)),))
        self.step = int(state["step"])
        if state.get("kv_scales") is not None and self.recipe.kv_fp8:
            self.kv_scales = KVScales(**state["kv_scales"])
            self.group.run("kv_scales", "set_kv_scales", common=(self.kv_scales,))

    def shutdown(self) -> None:
        self.group.shutdown()


class RayGeneration(GenerationInterface):
    """Data-parallel rollout: seed shards (see data_split) in contiguous blocks per data-parallel group (every TP
    rank of a group runs its group's shards), merged in order."""

    def __init__(
        self,
        group: RayWorkerGroup,
        num_seed_shards: int,
        pad_token_id: int,
        engine_changes: Mapping | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        self.group = group
        self.num_seed_shards = int(num_seed_shards)
        self.pad_token_id = int(pad_token_id)
        self.engine_changes = dict(engine_changes or {})
        self.tp = int(tensor_parallel_size)
        self._kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The FP8 KV scales (k [L], v [L]) last handed to the workers' engines, or None."""
        return self._kv_scales

    def replace(self, **changes) -> RayGeneration:
        """The workers' engines with some constructor arguments changed for these calls (as
        `NativeGenerationEngine.replace`, e.g. `kv_cache_dtype=None` for the calibration rollout)."""
        changes = {**self.engine_changes, **changes}
        engine = RayGeneration(self.group, self.num_seed_shards, self.pad_token_id, changes, self.tp)
        engine._kv_scales = self._kv_scales
        return engine

    def generate(self, prompt_ids, *, greedy=False, generator=None) -> GenerationOutput:
        base = generator.initial_seed() if generator is not None else torch.initial_seed()
        shards = seed_shards(prompt_ids, self.num_seed_shards, base)
        blocks = assign_contiguous(shards, self.group.num_workers // self.tp)
        per_worker = per_rank([(block, greedy, self.engine_changes) for block in blocks], self.tp)
        results = group_leaders(self.group.run("generation", "generate", per_worker=per_worker), self.tp)
        return merge_generation_outputs([out for outs in results for out in outs], self.pad_token_id)

    def prepare_for_generation(self) -> bool:
        return True

    def finish_generation(self) -> bool:
        return True

    def update_weights(self, weights=None, *, kv_scales=None) -> None:
        """FP8 KV scales (k [L], v [L]) for every worker's engine; weights come with RayPolicy.prepare_refit."""
        if weights is not None:
            raise ValueError(
                "RayGeneration takes weights through RayPolicy.prepare_refit (FP8 all-gather on the workers), "
                "not through update_weights"
            )
        if kv_scales is not None:
            k, v = (t.detach().float().cpu().clone() for t in kv_scales)
            self.group.run("kv_scales", "set_engine_kv_scales", common=(k, v))
            self._kv_scales = (k, v)


def build_ray_policy_and_engine(
    cfg: Mapping[str, Any], spec: ClusterSpec, *, init_reference_model: bool = False
) -> tuple[RayPolicy, RayGeneration]:
    """Start the worker group, load + shard the policy on every worker, first refit; the driver's two handles."""
    if spec.tensor_parallel_size > 1:  # before any worker starts (the workers check the FP8 tiles per layer)
        check_tp_model(cfg["policy"]["model_name"], spec.tensor_parallel_size)
    group = RayWorkerGroup(spec)
    info = group.run("setup", "setup", common=(group.put(dict(cfg)), init_reference_model))[0]
    policy = RayPolicy(group, cfg, info, init_reference_model=init_reference_model)
    engine = RayGeneration(
        group, spec.num_seed_shards, policy.tokenizer.pad_token_id, tensor_parallel_size=spec.tensor_parallel_size
    )
    return policy, engine


def check_tp_model(model_name: str, tp: int) -> None:
    """ValueError naming `policy.dtensor_cfg.tensor_parallel_size` unless `tp` divides the model's query and KV heads
    (read from its config.json)."""
    from nemo_jetrl.distributed.tensor_parallel import check_tp_heads
    from nemo_jetrl.models.loading import check_model_dir, resolve_model_dir

    config = check_model_dir(resolve_model_dir(model_name))
    heads = int(config["num_attention_heads"])
    try:
        check_tp_heads(heads, int(config.get("num_key_value_heads") or heads), tp)
    except ValueError as exc:
        raise ValueError(
            f"policy.dtensor_cfg.tensor_parallel_size: {exc} of policy.model_name {model_name!r}"
        ) from None
