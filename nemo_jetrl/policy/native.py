"""Native single-process trainer: HF model + the FP8 recipe's module swap, AdamW, micro-batches, logprobs.

The trainer owns the model object; the native rollout engine runs on the very same modules (weights by reference),
so in unified FP8 the rollout uses the trainer's cached FP8 weight bits and scales.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_jetrl.models.batch_invariant import enable_batch_invariant
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.models.moe import convert_moe_blocks
from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.policy.auto_switches import announce, apply_matched_kernels, resolve_train_cuda_graphs
from nemo_jetrl.policy.interfaces import (
    LossFunction,
    PolicyInterface,
    TrainBatch,
    combine_step_metrics,
    metrics_to_floats,
)
from nemo_jetrl.policy.lr_scheduler import build_lr_scheduler
from nemo_jetrl.policy.micro_batches import MicroBatch, plan_micro_batches, token_budget
from nemo_jetrl.policy.moe_step import MoeTraining, RoutingAgreement
from nemo_jetrl.policy.nonfinite import (  # noqa: F401 - the errors are imported from here too
    NonFiniteError,
    NonFiniteStateError,
    first_nonfinite_in_step,
    fp8_weights_finite,
    nonfinite_model_state,
)
from nemo_jetrl.policy.sequence_packing import fixed_packed_window
from nemo_jetrl.policy.train_graphs import MicroBatchGraphs, batch_key, requantize_fp8_in_place
from nemo_jetrl.policy.trainer_setup import DTYPES, build_optimizer, trainer_kernels
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, convert_to_fp8, fp8_layers
from nemo_jetrl.precision.kv import KVScales, QKVCalibrator, make_attn_hook


class NativePolicy(PolicyInterface):
    """Trainer for one device. `policy_cfg`: the validated `policy` section as a plain dict."""

    def __init__(
        self,
        policy_cfg: Mapping[str, Any],
        recipe: PrecisionRecipe,
        device: torch.device,
        *,
        init_reference_model: bool = False,
        seed: int = 0,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        """`init_reference_model`: keep a frozen copy of the loaded weights (the KL penalty's reference).
        `model` / `tokenizer`: use these (e.g. a random-weight benchmark model) instead of loading model_name."""
        self.cfg = policy_cfg
        self.recipe = recipe
        self.device = device
        self.compute_dtype = DTYPES[policy_cfg["compute_dtype"]]
        self.temperature = float(policy_cfg["generation"]["temperature"])
        self.kernels = trainer_kernels(policy_cfg)
        torch.manual_seed(seed)
        if model is None:
            model, tokenizer = load_model_and_tokenizer(
                policy_cfg["model_name"],
                device=device,
                dtype=DTYPES[policy_cfg["master_dtype"]],
                fp8_block=recipe.block_size if recipe.linear_fp8 else None,  # refuse unblockable dims before loading
                first_fp8_layer=recipe.num_first_layers_in_bf16,
                config_overrides=policy_cfg.get("hf_config_overrides"),
            )
        self.tokenizer = tokenizer
        convert_moe_blocks(model)  # a model handed in as HF built it (`load_model_and_tokenizer` converts its own)
        self.moe = MoeTraining.of(model, policy_cfg)  # None for a dense model (policy/moe_step.py)
        self.routing = RoutingAgreement()
        self.reference_model = None
        if init_reference_model:  # before the FP8 swap: the reference is the loaded model as is
            self.reference_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.layer_map = convert_to_fp8(model, recipe) if recipe.any_fp8 else {}
        if policy_cfg["generation"]["deterministic"]:  # the exact mode: batch-invariant kernels on both sides
            if not recipe.unified:
                raise ValueError(
                    "policy.generation.deterministic: true needs the trainer and the rollout in one precision (and "
                    "policy.fp8_cfg.train_kv_fake_quant with an FP8 KV cache)"
                )
            enable_batch_invariant(model)
        else:  # true, or auto: where the config allows it and the start-up self-check passes
            _, line = apply_matched_kernels(model, policy_cfg, recipe, device, self.compute_dtype)
            announce(line)
        self.model = model.train()
        self.optimizer = build_optimizer(self.model.parameters(), policy_cfg["optimizer"])
        self.lr_scheduler = build_lr_scheduler(self.optimizer, policy_cfg["scheduler"])
        self.step = 0  # optimizer steps taken
        # FP8 KV cache: per-step QKV calibration (docs/mismatch.md). `kv_scales` = the scales the rollout runs with
        # (set_kv_scales); the calibrator observes Q/K/V in the step's logprob forward ("fused", pre-update weights,
        # one step stale) or in an extra forward over the training batch after the optimizer step ("post_step";
        # forced in deterministic mode: the next rollout's scales come from the weights it runs on).
        gen_cfg = policy_cfg["generation"]
        self.kv_scales: KVScales | None = None
        self.kv_calibrator = (
            QKVCalibrator(model.config.num_hidden_layers, recipe.kv_calibration) if recipe.kv_fp8 else None
        )
        self.kv_calibration_pass = "post_step" if gen_cfg["deterministic"] else gen_cfg["kv_cache_calibration_pass"]
        self._last_train_batch: TrainBatch | None = None  # for the post_step pass
        self.train_graphs: MicroBatchGraphs | None = None  # policy.train_cuda_graphs (policy/train_graphs.py)
        graphs, line = resolve_train_cuda_graphs(policy_cfg, device, moe=self.moe is not None)  # auto: where correct
        announce(line)
        if graphs:
            self.train_graphs = MicroBatchGraphs(self.model, watched=self._captured_inputs)

    @property
    def has_reference(self) -> bool:
        return self.reference_model is not None

    def parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    # ---------------------------------------------------------------- logprobs
    @torch.no_grad()
    def _logprobs(
        self,
        model: torch.nn.Module,
        batch: TrainBatch,
        *,
        calibrate: bool = False,
        fake: KVScales | None = None,
        compare_routing: bool = False,
    ) -> torch.Tensor:
        """Per-token logprobs [B, S] of `model` over `batch` (0 outside each micro-batch window); K/V fake-quantized
        with `fake`; `calibrate` hands every micro-batch's Q/K/V amax to the calibrator; `compare_routing`: an MoE
        forward's routing against the rollout's (`self.routing`). The trainer's own model replays captured
        micro-batches under `policy.train_cuda_graphs`."""
        graphs = self.train_graphs if model is self.model else None
        if graphs is not None:
            graphs.check_state()
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # [B, S]
        logps = []
        for part in plan_micro_batches(batch.attention_mask, self.cfg, "logprob"):
            host_mb, packing, own = self._micro_batch(batch, part, "logprob", graphs)

            def forward(mb: TrainBatch, _norm, packing: PackedRows | None, host_mask=host_mb.attention_mask):
                return self._forward(model, mb, host_mask, calibrate, fake, packing, compare=compare_routing)

            if graphs is not None:
                key = batch_key(host_mb, "logprob", calibrate, fake is not None, packing=packing)
                logp, outputs = graphs.run(key, host_mb, 0.0, forward, packing)
            else:
                logp, outputs = forward(host_mb.to(self.device), None, None)
            if calibrate:
                self.kv_calibrator.add_record(outputs["kv/amax"])
            self.routing.add(outputs)
            logps.append((part, logp if own is None else logp[own]))
        for part, logp in logps:  # device -> host after every launch: no wait between micro-batches
            part.scatter(out, logp)
        return out

    def _micro_batch(
        self, batch: TrainBatch, part: MicroBatch, kind: str, graphs: MicroBatchGraphs | None
    ) -> tuple[TrainBatch, PackedRows | None, tuple[slice, slice] | None]:
        """A pass's micro-batch on the host. Captured and packed: in the fixed layout of `fixed_packed_window`, with
        its packing and the (rows, cols) of its own values in the results; else the window, None, None."""
        host_mb = batch.window(part.rows, part.cols)
        if graphs is None or self.kernels["pack_round"] is None:
            return host_mb, None, None
        width = max(batch.input_ids.shape[1], int(self.cfg["max_total_sequence_length"]))
        return fixed_packed_window(host_mb, token_budget(self.cfg, kind), self.kernels["pack_round"], width)

    def _forward(
        self,
        model: torch.nn.Module,
        mb: TrainBatch,
        host_mask: torch.Tensor,
        calibrate: bool,
        fake: KVScales | None,
        packing: PackedRows | None = None,
        *,
        aux_weight: float | None = None,
        compare: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One micro-batch's logprobs [b, w] through `model` (K/V fake-quantized with `fake`; packed as `packing`
        where given) and what it observed: with `calibrate` its Q/K/V amax [L, 3] (`kv/amax`), observed by a
        calibrator of its own (a captured forward returns the record as an output, and the trainer's calibrator
        takes it after the replay, `QKVCalibrator.add_record`); an MoE model's load-balancing loss (`aux_weight`:
        the micro-batch's share of the step's tokens) and routing agreement (`compare`), policy/moe_step.py."""
        scratch = QKVCalibrator(self.kv_calibrator.num_layers, self.kv_calibrator.calibration) if calibrate else None
        moe = None
        if self.moe is not None and model is self.model:
            moe = self.moe.observe(model, mb, host_mask, self.kernels, packing, aux_weight=aux_weight, compare=compare)
            packing = moe.packing
        with moe.observing(model) if moe is not None else contextlib.nullcontext():
            logp = sequence_logprobs(
                model, mb.input_ids, mb.attention_mask, temperature=self.temperature, compute_dtype=self.compute_dtype,
                attn_hook=make_attn_hook(scratch, fake), host_mask=host_mask, packing=packing, **self.kernels,
            )  # fmt: skip
        extras = {} if scratch is None else {"kv/amax": scratch.last_record()}
        return logp, {**extras, **(moe.outputs() if moe is not None else {})}

    def _kv_fused(self) -> bool:
        """FP8 KV scales observed in the step's prev_logprobs forward (the logprob pass or the training forward)."""
        return self.kv_calibrator is not None and self.kv_calibration_pass == "fused"

    def get_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        fused = self._kv_fused()
        if fused:
            self.kv_calibrator.reset()
        self.routing.counts.clear()  # this forward's routing agreement is the step's (`train()` reports it)
        return self._logprobs(
            self.model, batch, calibrate=fused, fake=self._fake_quant_scales(), compare_routing=self.moe is not None
        )

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
        self.kv_calibrator.reset()
        self._logprobs(self.model, batch, calibrate=True, fake=self._fake_quant_scales(required=False))
        self.set_kv_scales(self.kv_calibrator.scales())
        return self.kv_scales

    def get_reference_policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if self.reference_model is None:
            raise RuntimeError("reference logprobs need loss_fn.reference_policy_kl_penalty > 0")
        return self._logprobs(self.reference_model, batch)

    # ---------------------------------------------------------------- training
    def train(self, batch: TrainBatch | Sequence[TrainBatch], loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step per batch (see PolicyInterface.train), then one LR-scheduler step."""
        steps = [batch] if isinstance(batch, TrainBatch) else list(batch)
        if any(b.prev_logprobs is None for b in steps):  # prev_logprobs from the training forward (filled in place)
            if self.cfg["prev_logprobs_source"] != "train_forward":
                raise ValueError(
                    "train() needs batch.prev_logprobs (call get_logprobs first, or set "
                    "policy.prev_logprobs_source: train_forward)"
                )
            if len(steps) != 1:
                raise ValueError(f"prev_logprobs from the training forward need one optimizer step, got {len(steps)}")
            if self._kv_fused():
                self.kv_calibrator.reset()
            self.routing.counts.clear()
        per_step = [self._optimizer_step(b, loss_fn) for b in steps]
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        if self.kv_calibration_pass == "post_step" and len(steps) > 1:  # calibrate on the whole GRPO batch
            self._last_train_batch = TrainBatch.cat(steps)
        return {**combine_step_metrics(per_step), **self.routing.pop_metrics()}

    def _optimizer_step(self, batch: TrainBatch, loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step; the loss is normalised over the GLOBAL batch so micro-batches sum to its mean.

        No host sync between micro-batches (the launch queue stays ahead of the device): metrics, non-finite
        checks and the gradient norm are read together once, after the last backward and before the update.
        """
        from_forward = batch.prev_logprobs is None  # train_forward: this forward's logprobs are prev_logprobs
        if from_forward:
            batch.prev_logprobs = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # [B, S], filled below
        normalizer = loss_fn.normalizer(batch)
        self._last_train_batch = batch if self.kv_calibration_pass == "post_step" else None
        self.model.train()
        graphs = self.train_graphs
        self.optimizer.zero_grad(set_to_none=graphs is None)  # captured backwards accumulate into kept gradients
        if graphs is not None:
            graphs.check_state()
        fp8_ok = fp8_weights_finite(self.model)  # 0-d bool (None without FP8 layers), read with the metrics
        calibrating = from_forward and self._kv_fused()  # this forward's Q/K/V amax go to the calibrator
        fake = self._fake_quant_scales()
        step_tokens = max(1.0, float(batch.attention_mask.sum()))  # an MoE load-balancing loss's weights

        def micro_batch(mb: TrainBatch, norm: torch.Tensor | float, packing: PackedRows | None):
            """Forward, loss, backward of one micro-batch on the device -> (its logprobs when they are prev_logprobs,
            {metric: 0-d tensor, plus the non-finite checks as check/*, and the Q/K/V amax [L, 3] as kv/amax})."""
            aux_weight = float(host_mb.attention_mask.sum()) / step_tokens
            logp, extras = self._forward(
                self.model, mb, host_mb.attention_mask, calibrating, fake, packing, aux_weight=aux_weight,
                compare=from_forward,
            )  # logp: [b, w]  # fmt: skip
            check, prev = {}, None
            if from_forward:
                prev = logp.detach().float()
                mb = dataclasses.replace(mb, prev_logprobs=prev)
                valid = mb.response_mask.bool()  # [b, w]
                check = {"check/bad_logps": (~torch.isfinite(prev) & valid).sum(), "check/valid": valid.sum()}
            aux = extras.pop("moe/aux_loss", None)
            loss, metrics = loss_fn(logp.float(), mb, norm)
            if aux is not None:  # the MoE load-balancing loss (policy/moe_step.py)
                loss = loss + aux
                metrics = {**metrics, "moe/load_balancing_loss": extras.pop("moe/load_balancing_loss")}
            loss.backward()
            return prev, {**metrics, **check, **extras, "check/loss": loss.detach()}

        # On CUDA the normalizer is a device scalar (as a captured micro-batch needs it: same bits either way).
        eager_norm = torch.full((), normalizer, device=self.device) if self.device.type == "cuda" else normalizer
        per_mb, checks, forward_logps = [], [], []
        replays = graphs.replays if graphs is not None else 0
        for part in plan_micro_batches(batch.attention_mask, self.cfg, "train"):
            host_mb, packing, own = self._micro_batch(batch, part, "train", graphs)
            if graphs is not None:
                key = batch_key(host_mb, "train", from_forward, calibrating, fake is not None, packing=packing)
                prev, outputs = graphs.run(key, host_mb, normalizer, micro_batch, packing)
            else:
                prev, outputs = micro_batch(host_mb.to(self.device), eager_norm, None)
            if prev is not None:
                forward_logps.append((part, prev if own is None else prev[own]))
            if calibrating:
                self.kv_calibrator.add_record(outputs.pop("kv/amax"))
            self.routing.add({k: outputs.pop(k) for k in ("moe/routing_match", "moe/routing_total") if k in outputs})
            per_mb.append({k: v for k, v in outputs.items() if not k.startswith("check/")})
            checks.append({k.removeprefix("check/"): v for k, v in outputs.items() if k.startswith("check/")})
        # = clip_grad_norm_, split so that a non-finite norm is caught with the gradients still as computed
        params = [p for p in self.model.parameters() if p.grad is not None]
        total_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        step_checks = {"grad_norm": total_norm, **({"fp8_ok": fp8_ok} if fp8_ok is not None else {})}
        n_micro = len(per_mb)
        resolved = metrics_to_floats([*per_mb, *checks, step_checks])  # the step's one host sync
        per_mb, checks, step_checks = resolved[:n_micro], resolved[n_micro:-1], resolved[-1]
        self._raise_if_nonfinite(checks, step_checks)
        for part, logps in forward_logps:  # device -> host after the sync: no wait between micro-batches
            part.scatter(batch.prev_logprobs, logps)
        grad_norm = step_checks["grad_norm"]
        if self.cfg["max_grad_norm"] is not None:
            torch.nn.utils.clip_grads_with_norm_(params, float(self.cfg["max_grad_norm"]), total_norm)
        self.optimizer.step()
        if graphs is not None:  # the captured micro-batches read the FP8 weights where they lie
            requantize_fp8_in_place(self.model.modules())
        else:
            self._invalidate_fp8_weights()
        self.step += 1
        sums: dict[str, float] = {}
        for metrics in per_mb:
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        out = {k: v / n_micro for k, v in sums.items()}
        # `loss` is a sum of globally-normalised micro-batch losses, not a mean of them.
        if "loss" in sums:
            out["loss"] = sums["loss"]
        out.update(grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"], num_micro_batches=float(n_micro))
        if graphs is not None:  # micro-batches replayed (the rest ran eagerly: a new shape's warm-up or capture)
            out["cuda_graph_replay_fraction"] = (graphs.replays - replays) / n_micro
        return out

    def _raise_if_nonfinite(self, checks: list[dict[str, float]], step_checks: dict[str, float]) -> None:
        """NonFiniteError (gradients dropped, no update) when a check of the step failed (`first_nonfinite_in_step`)."""
        what = first_nonfinite_in_step(self.model, checks, step_checks)
        if what is not None:
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(what, self.step)

    def _invalidate_fp8_weights(self) -> None:
        """Drop every cached FP8 weight after an optimizer step: the fused AdamW writes the master weights without
        bumping their version counters, so the version key alone would keep serving the pre-step FP8 bits."""
        for module in self.model.modules():
            if isinstance(module, Fp8Linear):
                module.invalidate_quantized_weight()

    def nonfinite_state(self) -> str | None:
        return nonfinite_model_state(self.model, self.kv_scales)

    def prepare_refit(self) -> dict[str, float]:
        """Quantize every FP8 weight once for this step; the rollout then takes these very tensors by reference. The
        step's gradients are freed: the rollout and the next logprob pass get their memory (captured micro-batches
        keep theirs: their backwards accumulate into them)."""
        if self.train_graphs is None:
            self.optimizer.zero_grad(set_to_none=True)
        layers = fp8_layers(self.model)
        for _, module in layers:
            module.quantized_weight()
        metrics = {"num_fp8_weights": float(len(layers))}
        if self.kv_calibrator is not None:
            metrics.update(self._recalibrate_kv())
        return metrics

    def _recalibrate_kv(self) -> dict[str, float]:
        """New KV scales for the next rollout: from this step's fused observations, or a post-step forward."""
        if self.kv_calibration_pass == "post_step" and self._last_train_batch is not None:
            self.calibrate_kv_scales(self._last_train_batch)
        elif self.kv_calibration_pass != "post_step" and self.kv_calibrator.num_micro_batches:
            self.set_kv_scales(self.kv_calibrator.scales())
        else:
            return {}
        self._last_train_batch = None
        return {f"kv_{k}": v for k, v in self.kv_scales.metrics().items()}

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step}
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        if self.kv_scales is not None:  # the next rollout's FP8 KV scales: a resume continues bit for bit
            state["kv_scales"] = {n: getattr(self.kv_scales, n).cpu() for n in ("q", "k", "v")}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.step = int(state["step"])
        if state.get("kv_scales") is not None and self.kv_calibrator is not None:
            self.set_kv_scales(KVScales(**state["kv_scales"]))
