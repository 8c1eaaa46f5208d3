"""The trainer for every world size: HF model + the FP8 recipe's module swap, AdamW, micro-batches, logprobs.

One process (`ParallelPlan` "none"): the trainer owns the model object and the native rollout engine runs on the
very same modules (weights by reference), so in unified FP8 the rollout uses the trainer's cached FP8 weight bits
and scales. One rank of W (plans "fsdp" / "fsdp_tp", torchrun or a Ray worker): the same class over a sharded
model and a rollout replica the refit fills (`policy/parallel/sharding.py`); every method is then collective (all
ranks, same order, same arguments) and returns the one-process result on every rank.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from nemo_jetrl.config.typed import typed_section
from nemo_jetrl.models.batch_invariant import enable_batch_invariant
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.models.moe import convert_moe_blocks
from nemo_jetrl.models.scoring import PolicyLogprobs
from nemo_jetrl.policy.auto_switches import announce, apply_matched_kernels, resolve_train_cuda_graphs
from nemo_jetrl.policy.interfaces import LossFunction, PolicyInterface, TrainBatch, combine_step_metrics
from nemo_jetrl.policy.lr_scheduler import build_lr_scheduler
from nemo_jetrl.policy.moe_step import MoeTraining, RoutingAgreement
from nemo_jetrl.policy.nonfinite import (  # noqa: F401 - the errors are imported from here too
    NonFiniteError,
    NonFiniteStateError,
    nonfinite_model_state,
)
from nemo_jetrl.policy.parallel.plan import ParallelPlan
from nemo_jetrl.policy.parallel.sharding import full_state, lay_out_trainer, load_full_state
from nemo_jetrl.policy.train_graphs import MicroBatchGraphs
from nemo_jetrl.policy.trainer_core import TrainerCore
from nemo_jetrl.policy.trainer_setup import DTYPES, build_optimizer, trainer_kernels
from nemo_jetrl.precision import (
    PrecisionRecipe,
    convert_to_fp8,
    fp8_layers,
    invalidate_fp8_caches,
    use_transient_fp8_weights,
)
from nemo_jetrl.precision.kv import KVScales, QKVCalibrator
from nemo_jetrl.utils.device_memory import release_cached_memory

if TYPE_CHECKING:  # the section type imports pydantic: the trainer imports without it (the GPU box)
    from nemo_jetrl.policy.config import PolicyConfig


class NativePolicy(TrainerCore, PolicyInterface):
    """The trainer of one process, or of one rank of a sharded trainer (`plan`). `policy_cfg`: the validated
    `policy` section (`policy.config.PolicyConfig`; a dict is refused), kept as `cfg`."""

    def __init__(
        self,
        policy_cfg: PolicyConfig,
        recipe: PrecisionRecipe,
        device: torch.device,
        *,
        plan: ParallelPlan | None = None,
        init_reference_model: bool = False,
        seed: int = 0,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        announce_lines: bool = True,
    ) -> None:
        """`init_reference_model`: keep a frozen copy of the loaded weights (the KL penalty's reference).
        `model` / `tokenizer`: use these (e.g. a random-weight benchmark model) instead of loading model_name.
        `plan`: the ranks the trainer spreads over (default: this process alone). `announce_lines`: print the
        start-up lines of the `auto` switches (the first rank; a Ray worker's driver prints them instead), which
        `startup_lines` keeps either way."""
        self.cfg = cfg = typed_section(policy_cfg, "PolicyConfig", "NativePolicy")
        self.plan = plan if plan is not None else ParallelPlan.single()
        self.startup_lines: list[str] = []
        self._announce_lines = announce_lines
        self.recipe, self.device = recipe, device
        self.compute_dtype = DTYPES[cfg.compute_dtype]
        self.temperature = float(cfg.generation.temperature)
        self.kernels = trainer_kernels(cfg)
        torch.manual_seed(seed)
        if model is None:
            model, tokenizer = load_model_and_tokenizer(
                cfg.model_name,
                device=device,
                dtype=DTYPES[cfg.master_dtype],
                fp8_block=recipe.block_size if recipe.linear_fp8 else None,  # refuse unblockable dims before loading
                first_fp8_layer=recipe.num_first_layers_in_bf16,
                config_overrides=cfg.hf_config_overrides,
            )
        self.tokenizer = tokenizer
        convert_moe_blocks(model)  # a model handed in as HF built it (`load_model_and_tokenizer` converts its own)
        self.moe = MoeTraining.of(model, cfg)  # None for a dense model (policy/moe_step.py)
        if self.moe is not None and self.plan.distributed:  # refused first: cluster_config.multi_rank_problems
            raise ValueError(
                f"an MoE model on {self.plan.world_size} ranks is not trained yet (the sharded trainer shards and "
                "refits dense weights only; expert parallelism is not built): train it in one process (docs/moe.md)"
            )
        self.routing = RoutingAgreement()
        self._parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # unsharded
        self.reference_model = None
        if init_reference_model:  # before the FP8 swap: the reference is the loaded model as is
            self.reference_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.layer_map = convert_to_fp8(model, recipe) if recipe.any_fp8 else {}
        self._choose_kernels(model, recipe, device)
        self.model = model.train()
        scorer_kwargs = dict(temperature=self.temperature, compute_dtype=self.compute_dtype, kernels=self.kernels)
        layout = lay_out_trainer(model, self.plan, recipe, **scorer_kwargs)  # shards `model` in place (W > 1)
        self.scorer, self.rollout_model, self.refitter, self.gather_counter = (
            layout.scorer, layout.rollout_model, layout.refitter, layout.counter
        )  # fmt: skip
        self.reference_scorer = None  # a full copy on every rank (no collectives)
        if self.reference_model is not None:
            self.reference_scorer = PolicyLogprobs(self.reference_model, **scorer_kwargs)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optimizer)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.scheduler)
        self.step = 0  # optimizer steps taken
        # FP8 KV cache: per-step QKV calibration (docs/mismatch.md). `kv_scales` = the scales the rollout runs with
        # (set_kv_scales); the calibrator observes Q/K/V in the step's logprob forward ("fused", pre-update weights,
        # one step stale) or in an extra forward over the training batch after the optimizer step ("post_step";
        # forced in deterministic mode: the next rollout's scales come from the weights it runs on).
        gen_cfg = cfg.generation
        self.kv_scales: KVScales | None = None
        self.kv_calibrator = (
            QKVCalibrator(model.config.num_hidden_layers, recipe.kv_calibration) if recipe.kv_fp8 else None
        )
        self.kv_calibration_pass = "post_step" if gen_cfg.deterministic else gen_cfg.kv_cache_calibration_pass
        self._last_train_batch: TrainBatch | None = None  # for the post_step pass
        self.train_graphs: MicroBatchGraphs | None = None  # policy.train_cuda_graphs (policy/train_graphs.py)
        graphs, line = (
            (False, None)
            if self._graphs_off_on_ranks()
            else resolve_train_cuda_graphs(cfg, device, moe=self.moe is not None)
        )
        self._startup_line(line)  # auto: on one CUDA device where correct
        if graphs:
            self.train_graphs = MicroBatchGraphs(self.model, watched=self._captured_inputs)
        elif cfg.dtensor_cfg.activation_checkpointing and cfg.fp8_cfg.transient_train_weights:
            use_transient_fp8_weights(self.model)  # one layer's FP8 weights alive at a time in training (captured
            # micro-batches read them where they lie: there the cache is kept)
        self._fp8_stale = self.refitter is not None  # the replica's FP8 bits predate the master weights
        self._refit_bytes = 0  # bytes the refits assembled since the last prepare_refit report
        self._fp8_gathered(count=False)

    def _choose_kernels(self, model: torch.nn.Module, recipe: PrecisionRecipe, device: torch.device) -> None:
        """Kernel choices both sides share, set on the model before a replica is copied from it (and before it is
        sharded). `matched_kernels: auto` runs the start-up self-check, on several ranks on each rank's device with
        one verdict for all (rank 0 says it; under Ray the driver prints rank 0's line)."""
        if self.cfg.generation.deterministic:  # the exact mode: batch-invariant kernels on both sides
            if not recipe.unified:
                raise ValueError(
                    "policy.generation.deterministic: true needs the trainer and the rollout in one precision (and "
                    "policy.fp8_cfg.train_kv_fake_quant with an FP8 KV cache)"
                )
            enable_batch_invariant(model)
        else:  # true, or auto: where the config allows it and the start-up self-check passes (on every rank)
            ranks = self.plan if self.plan.distributed else None
            _, line = apply_matched_kernels(model, self.cfg, recipe, device, self.compute_dtype, ranks)
            self._startup_line(line)

    def _startup_line(self, line: str | None) -> None:
        """Keep an `auto` switch's start-up line; the first rank prints it (unless `announce_lines` is off)."""
        if line:
            self.startup_lines.append(line)
            if self._announce_lines and self.plan.is_main:
                announce(line)

    def _graphs_off_on_ranks(self) -> bool:
        """Several ranks: no captured micro-batches (they cannot hold the sharded trainer's collectives); `auto` is
        off there and `true` refused (`cluster_config.multi_rank_problems`; here for a trainer built in code)."""
        if not self.plan.distributed:
            return False
        if self.cfg.train_cuda_graphs is True:
            raise ValueError(
                f"policy.train_cuda_graphs: true needs one CUDA device (the trainer runs on {self.device}, "
                f"{self.plan.world_size} rank(s): captured micro-batches cannot hold the sharded trainer's "
                "collectives); set policy.train_cuda_graphs: false"
            )
        return True

    @property
    def has_reference(self) -> bool:
        return self.reference_model is not None

    def parameter_bytes(self) -> int:
        return self._parameter_bytes

    # ---------------------------------------------------------------- logprobs
    def _kv_fused(self) -> bool:
        """FP8 KV scales observed in the step's prev_logprobs forward (the logprob pass or the training forward)."""
        return self.kv_calibrator is not None and self.kv_calibration_pass == "fused"

    def get_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        self._fp8_gathered()
        fused = self._kv_fused()
        if fused:
            self.kv_calibrator.reset()
        self.routing.counts.clear()  # this forward's routing agreement is the step's (`train()` reports it)
        return self._logprobs(
            self.scorer, batch, calibrate=fused, fake=self._fake_quant_scales(), compare_routing=self.moe is not None
        )

    def get_reference_policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if self.reference_scorer is None:
            raise RuntimeError("reference logprobs need loss_fn.reference_policy_kl_penalty > 0")
        return self._logprobs(self.reference_scorer, batch)

    # ---------------------------------------------------------------- FP8 KV scales
    def _fake_quant_scales(self, *, required: bool = True) -> KVScales | None:
        """The scales the trainer's K/V fake-quant uses (the rollout's); None without train_kv_fake_quant, or before
        the first calibration where not `required`."""
        if not self.recipe.train_kv_fake_quant:
            return None
        if required and self.kv_scales is None and self.kv_calibrator is not None:
            raise ValueError("train_kv_fake_quant needs KV scales first: call calibrate_kv_scales / set_kv_scales")
        return self.kv_scales

    def _captured_inputs(self) -> list[torch.Tensor]:
        """Tensors besides the model's that captured micro-batches read: the K/V fake-quant scales."""
        return [] if self.kv_scales is None else [self.kv_scales.q, self.kv_scales.k, self.kv_scales.v]

    def set_kv_scales(self, scales: KVScales) -> None:
        """The scales the rollout runs with from now on (the trainer's K/V fake-quant mirrors them); written into
        the tensors already held when micro-batches are captured (they read them where they lie)."""
        new = scales.to(self.device)
        held = self.kv_scales
        if self.train_graphs is not None and held is not None and held.k.shape == new.k.shape:
            for name in ("q", "k", "v"):
                getattr(held, name).copy_(getattr(new, name))
        else:
            self.kv_scales = new

    @torch.no_grad()
    def calibrate_kv_scales(self, batch: TrainBatch) -> KVScales:
        """A separate no-grad forward over `batch` observing Q/K/V; returns (and sets) the new scales."""
        if self.kv_calibrator is None:
            raise ValueError("calibrate_kv_scales needs policy.generation.kv_cache_dtype: fp8")
        self._fp8_gathered()
        self.kv_calibrator.reset()
        self._logprobs(self.scorer, batch, calibrate=True, fake=self._fake_quant_scales(required=False))
        self.set_kv_scales(self._observed_kv_scales())
        return self.kv_scales

    def _observed_kv_scales(self) -> KVScales | None:
        """Scales from every rank's records of the last calibrating pass, in micro-batch order (the one-process
        calibrator's, bit for bit); None when no rank recorded anything. Collective on several ranks."""
        if not self.plan.distributed:
            return self.kv_calibrator.scales() if self.kv_calibrator.num_micro_batches else None
        from nemo_jetrl.policy.parallel.kv_sync import scales_from_records

        records = self.plan.gather([r.cpu() for r in self.kv_calibrator.records])
        if not records:
            return None
        return scales_from_records(records, self.kv_calibrator.num_layers, self.recipe.kv_calibration, self.device)

    # ---------------------------------------------------------------- training
    def train(self, batch: TrainBatch | Sequence[TrainBatch], loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step per batch (see PolicyInterface.train), then one LR-scheduler step."""
        steps = [batch] if isinstance(batch, TrainBatch) else list(batch)
        if any(b.prev_logprobs is None for b in steps):  # prev_logprobs from the training forward (filled in place)
            if self.cfg.prev_logprobs_source != "train_forward":
                raise ValueError(
                    "train() needs batch.prev_logprobs (call get_logprobs first, or set "
                    "policy.prev_logprobs_source: train_forward)"
                )
            if len(steps) != 1:
                raise ValueError(f"prev_logprobs from the training forward need one optimizer step, got {len(steps)}")
            if self._kv_fused():
                self.kv_calibrator.reset()
            self.routing.counts.clear()
        release_cached_memory(self.device)  # the logprob pass's cached blocks: the training pass's sizes differ
        per_step = [self._optimizer_step(b, loss_fn) for b in steps]
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        if self.kv_calibration_pass == "post_step" and len(steps) > 1:  # calibrate on the whole GRPO batch
            self._last_train_batch = TrainBatch.cat(steps)
        return {**combine_step_metrics(per_step), **self.routing.pop_metrics()}

    # ---------------------------------------------------------------- refit
    def _fp8_gathered(self, count: bool = True) -> None:
        """Sharded plans: gather the FP8 bits (and the rest the rollout reads) of the current master weights into
        the rollout replica, which the trainer's FP8 linears read too (`policy/parallel/fp8_gather.py`); once per
        optimizer step. Collective. `count`: the bytes go into the next step's `allgather_bytes` (not those of
        setting the trainer up or loading a checkpoint, nor FSDP2's gathers before then)."""
        if self.refitter is None or not self._fp8_stale:
            return
        stats = self.refitter.refit("fp8")
        self._fp8_stale = False
        self._last_refit = stats.metrics()
        if count:
            self._refit_bytes += stats.fp8_weight_bytes + stats.other_bytes
        else:
            self.gather_counter.take()

    def prepare_refit(self) -> dict[str, float]:
        """Quantize every FP8 weight once for this step (one process: the rollout takes these very tensors by
        reference; sharded: quantize each shard, all-gather bits + scales into the replica), then recalibrate the
        FP8 KV scales; with the all-gather bytes since the last call (`allgather_bytes`). The step's gradients are
        freed first: the rollout and the next logprob pass get their memory (captured micro-batches keep theirs:
        their backwards accumulate into them)."""
        if self.train_graphs is None:
            self.optimizer.zero_grad(set_to_none=True)
        if self.refitter is None:
            layers = fp8_layers(self.model)
            for _, module in layers:
                module.quantized_weight()
            metrics = {"num_fp8_weights": float(len(layers))}
        else:
            self._fp8_gathered()
            metrics = dict(self._last_refit)
            fsdp = self.gather_counter.take()
            if self.gather_counter.supported:  # every byte counted (else no total: FSDP2's would be missing)
                metrics.update(fsdp_allgather_bytes=float(fsdp), allgather_bytes=float(fsdp + self._refit_bytes))
            self._refit_bytes = 0
        if self.kv_calibrator is not None:
            metrics.update(self._recalibrate_kv())
        return metrics

    def _recalibrate_kv(self) -> dict[str, float]:
        """New KV scales for the next rollout: from this step's fused observations, or a post-step forward."""
        if self.kv_calibration_pass == "post_step":
            if self._last_train_batch is None:
                return {}
            self.calibrate_kv_scales(self._last_train_batch)
        else:
            scales = self._observed_kv_scales()
            if scales is None:
                return {}
            self.set_kv_scales(scales)
        self._last_train_batch = None
        return {f"kv_{k}": v for k, v in self.kv_scales.metrics().items()}

    def nonfinite_state(self) -> str | None:
        """The first non-finite master weight, FP8 weight scale or KV scale of any rank (collective when sharded)."""
        return self.plan.first_of(nonfinite_model_state(self.model, self.kv_scales))

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The one-process layout (checkpoints move between plans and backends); sharded: collective, and the full
        tensors stay on rank 0 (the others get only `step`)."""
        if self.plan.distributed:
            state = full_state(self.model, self.optimizer, keep=self.plan.is_main)
        else:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        state["step"] = self.step
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        if self.kv_scales is not None:  # the next rollout's FP8 KV scales: a resume continues bit for bit
            state["kv_scales"] = {n: getattr(self.kv_scales, n).cpu() for n in ("q", "k", "v")}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.plan.distributed:
            load_full_state(self.model, self.optimizer, state)
            invalidate_fp8_caches(self.model)
            self._fp8_stale = True
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.step = int(state["step"])
        if state.get("kv_scales") is not None and self.kv_calibrator is not None:
            self.set_kv_scales(KVScales(**state["kv_scales"]))
        self._fp8_gathered(count=False)
