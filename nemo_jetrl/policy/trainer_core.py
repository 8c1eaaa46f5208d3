"""The trainer core, written once for every parallel plan (`policy/parallel/plan.py`): the micro-batch loops
of a logprob pass and of an optimizer step, the loss, the non-finite checks, the Q/K/V observation for the FP8 KV
scales, captured micro-batches (`policy.train_cuda_graphs`), packing / dynamic batching, prev_logprobs from the
training forward. One process is the plan "none" (world size 1): no collective, no dummy, nothing gathered.

On W ranks every pass is cut exactly as one process cuts it (`plan_micro_batches`), each data-parallel group runs
a contiguous block of the micro-batches (`ParallelPlan.share`), ranks with fewer run zero-weighted dummies (FSDP2's
collectives stay in lock-step), and what the groups computed comes back in micro-batch order on every rank
(`ParallelPlan.gather`): logprobs, per-micro-batch metrics, Q/K/V records. Each loss carries the global
normalizer and gradients are summed over the ranks, so the step is the one-process step (up to the order of the
gradient sum). A step is skipped on every rank together: the checks of all ranks are summed before anyone decides.

Every switch of the trainer's forward (`policy.trainer_setup.trainer_kernels`: fused glue kernels, causal attention,
packing, and activation checkpointing where the config asks for it) travels in the scorer (`PolicyLogprobs`, the
FSDP2 root when sharded) and so holds on every plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable

import torch

from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.policy.interfaces import LossFunction, TrainBatch, metrics_to_floats
from nemo_jetrl.policy.micro_batches import MicroBatch, plan_micro_batches, token_budget
from nemo_jetrl.policy.nonfinite import NonFiniteError, first_nonfinite_in_step, fp8_weights_finite
from nemo_jetrl.policy.parallel.fsdp import clip_grads, total_grad_norm
from nemo_jetrl.policy.parallel.tensor_parallel import reduce_head_local_grads
from nemo_jetrl.policy.sequence_packing import fixed_packed_window
from nemo_jetrl.policy.train_graphs import MicroBatchGraphs, batch_key, requantize_fp8_in_place
from nemo_jetrl.precision import invalidate_fp8_caches
from nemo_jetrl.precision.kv import KVScales, QKVCalibrator, make_attn_hook


class TrainerCore:
    """The loops `NativePolicy` runs; see the module docstring. Attributes it reads (set by `NativePolicy`):
    `cfg` (the validated `policy` section, a `PolicyConfig`), `plan`, `device`, `model` (the HF model, sharded in
    place), `scorer` (its logprob root), `optimizer`, `train_graphs`, `kv_calibrator`, `step`, `kernels`, `moe` /
    `routing` (an MoE model's settings and routing agreement, policy/moe_step.py), `_fp8_gathered`."""

    # ---------------------------------------------------------------- one micro-batch
    def _micro_batch(
        self, batch: TrainBatch, part: MicroBatch, kind: str, graphs: MicroBatchGraphs | None
    ) -> tuple[TrainBatch, PackedRows | None, tuple[slice, slice] | None]:
        """A pass's micro-batch on the host. Captured and packed: in the fixed layout of `fixed_packed_window`, with
        its packing and the (rows, cols) of its own values in the results; else the window, None, None."""
        host_mb = batch.window(part.rows, part.cols)
        if graphs is None or self.kernels["pack_round"] is None:
            return host_mb, None, None
        width = max(batch.input_ids.shape[1], self.cfg.max_total_sequence_length)
        return fixed_packed_window(host_mb, token_budget(self.cfg, kind), self.kernels["pack_round"], width)

    def _forward(
        self,
        scorer: torch.nn.Module,
        mb: TrainBatch,
        host_mask: torch.Tensor,
        calibrate: bool,
        fake: KVScales | None,
        packing: PackedRows | None = None,
        *,
        aux_weight: float | None = None,
        compare: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One micro-batch's logprobs [b, w] through `scorer` (K/V fake-quantized with `fake`; packed as `packing`
        where given) and what it observed: with `calibrate` its Q/K/V amax [L, 3] (`kv/amax`, maxed over the TP
        group: every head's), observed by a calibrator of its own (a captured forward returns the record as an
        output, and the trainer's calibrator takes it after the replay, `QKVCalibrator.add_record`); an MoE
        model's load-balancing loss (`aux_weight`: the micro-batch's share of the step's tokens) and routing
        agreement (`compare`), policy/moe_step.py."""
        scratch = QKVCalibrator(self.kv_calibrator.num_layers, self.kv_calibrator.calibration) if calibrate else None
        moe = None
        if self.moe is not None and scorer is self.scorer:
            moe = self.moe.observe(
                self.model, mb, host_mask, self.kernels, packing, aux_weight=aux_weight, compare=compare
            )
            packing = moe.packing
        hook = make_attn_hook(scratch, fake)
        with moe.observing(self.model) if moe is not None else contextlib.nullcontext():
            logp = scorer(mb.input_ids, mb.attention_mask, attn_hook=hook, host_mask=host_mask, packing=packing)
        extras = {} if scratch is None else {"kv/amax": self.plan.max_over_tp(scratch.last_record())}
        return logp, {**extras, **(moe.outputs() if moe is not None else {})}

    # ---------------------------------------------------------------- the logprob pass
    @torch.no_grad()
    def _logprobs(
        self,
        scorer: torch.nn.Module,
        batch: TrainBatch,
        *,
        calibrate: bool = False,
        fake: KVScales | None = None,
        compare_routing: bool = False,
    ) -> torch.Tensor:
        """Per-token logprobs [B, S] of `scorer` over `batch` (0 outside each micro-batch window); K/V fake-quantized
        with `fake`; `calibrate` hands every micro-batch's Q/K/V amax to the calibrator; `compare_routing`: an MoE
        forward's routing against the rollout's (`self.routing`). The trainer's own scorer replays captured
        micro-batches under `policy.train_cuda_graphs`."""
        graphs = self.train_graphs if scorer is self.scorer else None
        if graphs is not None:
            graphs.check_state()
        parts = plan_micro_batches(batch.attention_mask, self.cfg, "logprob")
        mine, steps = self.plan.share(parts)
        logps = []
        for i in range(steps):
            real = i < len(mine)
            host_mb, packing, own = self._micro_batch(batch, mine[i] if real else parts[0], "logprob", graphs)

            def forward(mb: TrainBatch, _norm, packing: PackedRows | None, host_mask=host_mb.attention_mask, real=real):
                return self._forward(scorer, mb, host_mask, calibrate and real, fake, packing, compare=compare_routing)

            if graphs is not None:
                key = batch_key(host_mb, "logprob", calibrate, fake is not None, packing=packing)
                logp, outputs = graphs.run(key, host_mb, 0.0, forward, packing)
            else:
                logp, outputs = forward(host_mb.to(self.device), None, None)
            if real:
                if calibrate:
                    self.kv_calibrator.add_record(outputs["kv/amax"])
                self.routing.add(outputs)
                logps.append(logp if own is None else logp[own])
        return self._scatter(parts, logps, torch.zeros(batch.input_ids.shape, dtype=torch.float32))  # [B, S]

    def _scatter(self, parts: list[MicroBatch], mine: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Every micro-batch's values (this rank's `mine`, gathered from every group) written into `out` [B, S]:
        device -> host after every launch, no wait between micro-batches."""
        pieces = self.plan.gather([t.cpu() for t in mine]) if self.plan.distributed else mine
        for part, values in zip(parts, pieces, strict=True):
            part.scatter(out, values)
        return out

    # ---------------------------------------------------------------- the optimizer step
    def _optimizer_step(self, batch: TrainBatch, loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step; the loss is normalised over the GLOBAL batch so micro-batches sum to its mean.

        No host sync between micro-batches (the launch queue stays ahead of the device): metrics, non-finite
        checks and the gradient norm are read together once, after the last backward and before the update.
        """
        self._fp8_gathered()  # the FP8 bits of the current master weights (sharded plans: after the last step)
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
        micro_batch = self._micro_batch_step(loss_fn, from_forward, calibrating, fake, step_tokens)
        # On CUDA the normalizer is a device scalar (as a captured micro-batch needs it: same bits either way).
        eager_norm = torch.full((), normalizer, device=self.device) if self.device.type == "cuda" else normalizer
        parts = plan_micro_batches(batch.attention_mask, self.cfg, "train")
        mine, steps = self.plan.share(parts)
        per_mb, checks, forward_logps = [], [], []
        replays = graphs.replays if graphs is not None else 0
        for i in range(steps):
            real = i < len(mine)
            host_mb, packing, own = self._micro_batch(batch, mine[i] if real else parts[0], "train", graphs)
            if graphs is not None:
                key = batch_key(host_mb, "train", from_forward, calibrating, fake is not None, packing=packing)
                prev, outputs = graphs.run(key, host_mb, normalizer, micro_batch, packing)
            else:  # a dummy (sharded plans: a rank with fewer micro-batches) adds nothing to the gradient
                prev, outputs = micro_batch(host_mb.to(self.device), eager_norm, None, host_mb.attention_mask, real)
            if not real:
                continue
            if prev is not None:
                forward_logps.append(prev if own is None else prev[own])
            if calibrating:
                self.kv_calibrator.add_record(outputs.pop("kv/amax"))
            self.routing.add({k: outputs.pop(k) for k in ("moe/routing_match", "moe/routing_total") if k in outputs})
            per_mb.append({k: v for k, v in outputs.items() if not k.startswith("check/")})
            checks.append({k.removeprefix("check/"): v for k, v in outputs.items() if k.startswith("check/")})
        params = [p for p in self.model.parameters() if p.grad is not None]
        self._sum_partial_grads()
        total_norm = total_grad_norm([p.grad for p in params])  # 0-d, global (sharded grads: per mesh, combined)
        step_checks = {"grad_norm": total_norm, **({"fp8_ok": fp8_ok} if fp8_ok is not None else {})}
        if self.plan.distributed:  # every rank's failed checks, summed: all ranks skip the step together
            step_checks["failed_anywhere"] = self.plan.sum_(_failed_checks(checks, fp8_ok, self.device))
        n_local = len(per_mb)
        resolved = metrics_to_floats([*per_mb, *checks, step_checks])  # the step's one host sync
        per_mb, checks, step_checks = resolved[:n_local], resolved[n_local:-1], resolved[-1]
        self._raise_if_nonfinite(checks, step_checks)
        if from_forward:
            self._scatter(parts, forward_logps, batch.prev_logprobs)
        per_mb = self.plan.gather(per_mb)  # every micro-batch's metrics, in micro-batch order
        if self.cfg.max_grad_norm is not None:
            clip_grads([p.grad for p in params], float(self.cfg.max_grad_norm), total_norm)
        self.optimizer.step()
        if graphs is not None:  # the captured micro-batches read the FP8 weights where they lie
            requantize_fp8_in_place(self.model.modules())
        else:
            invalidate_fp8_caches(self.model)
        self._fp8_stale = True
        self.step += 1
        return self._step_metrics(per_mb, step_checks, graphs, replays)

    def _micro_batch_step(
        self, loss_fn: LossFunction, from_forward: bool, calibrating: bool, fake: KVScales | None, step_tokens: float
    ) -> Callable:
        """fn(mb, normalizer, packing[, host_mask, real]): forward, loss, backward of one micro-batch on the device
        -> (its logprobs when they are prev_logprobs, {metric: 0-d tensor, plus the non-finite checks as check/*,
        the Q/K/V amax [L, 3] as kv/amax, an MoE model's routing counts}); a dummy (`real` false) backpropagates
        its loss times zero. `step_tokens`: the step's real tokens (an MoE load-balancing loss's weights)."""

        def micro_batch(mb: TrainBatch, norm, packing: PackedRows | None, host_mask=None, real: bool = True):
            host_mask = mb.attention_mask if host_mask is None else host_mask
            aux_weight = float(host_mask.sum()) / step_tokens if self.moe is not None else None  # MoE: no graphs
            logp, extras = self._forward(
                self.scorer, mb, host_mask, calibrating and real, fake, packing, aux_weight=aux_weight,
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
            (loss if real else loss * 0.0).backward()
            return prev, {**metrics, **check, **extras, "check/loss": loss.detach()}

        return micro_batch

    def _sum_partial_grads(self) -> None:
        """Tensor parallel: q_norm / k_norm saw this rank's heads only; their gradients are summed over the group."""
        if self.plan.tp_group is not None:
            reduce_head_local_grads(self.model, self.plan.tp_group)

    def _step_metrics(self, per_mb: list[dict], step_checks: dict, graphs, replays: int) -> dict[str, float]:
        n_micro = len(per_mb)
        sums: dict[str, float] = {}
        for metrics in per_mb:
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        out = {k: v / n_micro for k, v in sums.items()}
        # `loss` is a sum of globally-normalised micro-batch losses, not a mean of them.
        if "loss" in sums:
            out["loss"] = sums["loss"]
        lr = self.optimizer.param_groups[0]["lr"]
        out.update(grad_norm=step_checks["grad_norm"], lr=lr, num_micro_batches=float(n_micro))
        if graphs is not None:  # micro-batches replayed (the rest ran eagerly: a new shape's warm-up or capture)
            out["cuda_graph_replay_fraction"] = (graphs.replays - replays) / n_micro
        return out

    def _raise_if_nonfinite(self, checks: list[dict[str, float]], step_checks: dict[str, float]) -> None:
        """NonFiniteError (gradients dropped, no update) when a check of the step failed on any rank: the first
        failing rank's `first_nonfinite_in_step` names it."""
        what = first_nonfinite_in_step(self.model, checks, step_checks)
        grad_norm = step_checks["grad_norm"]  # the global norm: the same on every rank
        if self.plan.distributed and (step_checks["failed_anywhere"] or not math.isfinite(grad_norm)):
            what = self.plan.first_of(what) or f"gradient (grad norm {grad_norm})"
        if what is not None:
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(what, self.step)


def _failed_checks(checks: list[dict], fp8_ok: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """How many of this rank's checks failed (non-finite losses, trainer logprobs, FP8 weights): float32 0-d."""
    failed = [torch.zeros((), device=device)]
    for c in checks:
        failed.append((~torch.isfinite(c["loss"])).float())
        if "bad_logps" in c:
            failed.append((c["bad_logps"] > 0).float())
    if fp8_ok is not None:
        failed.append((~fp8_ok).float())
    return torch.stack([f.to(device) for f in failed]).sum()
