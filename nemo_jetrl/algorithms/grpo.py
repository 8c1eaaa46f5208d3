"""The GRPO loop. One step reads like the Jet-RL paper:

generate (rollout on the trainer's FP8 weights) -> score (rewards from decoded text) -> trainer logprobs (+ mismatch
metrics) -> group advantages -> train (FP8 FProp/DGrad/WGrad) -> quantize weights once for the next rollout.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from nemo_jetrl.algorithms.advantages import group_advantages, zero_std_groups
from nemo_jetrl.algorithms.dapo import Rollout, dynamic_sampling, overlong_filter, scale_rewards, shape_rewards
from nemo_jetrl.algorithms.grpo_checkpoint import (
    checkpoint_console,
    checkpoint_manager,
    checkpoint_metrics,
    checkpoint_state,
    load_resume_state,
    restore,
)
from nemo_jetrl.algorithms.grpo_setup import GrpoSetup
from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.algorithms.memory_preflight import memory_estimates, memory_preflight
from nemo_jetrl.algorithms.metric_names import nemo_rl_rollout_metrics, nemo_rl_timing
from nemo_jetrl.algorithms.mismatch import step_mismatch_metrics
from nemo_jetrl.algorithms.placement import place, start_ranks, sync_ranks
from nemo_jetrl.algorithms.preflight import (
    check_checkpoint_space,
    check_output_dirs,
    check_validation_set,
    output_dirs,
)
from nemo_jetrl.algorithms.rollout_io import (
    bootstrap_kv_scales,
    decode_responses,
    encode_prompts,
    needs_kv_bootstrap,
    step_generator,
)
from nemo_jetrl.algorithms.run_config import RunConfig, run_config
from nemo_jetrl.algorithms.validation import check_reference, env_metrics, validate
from nemo_jetrl.environments import make_task
from nemo_jetrl.generation.interfaces import max_prompt_length, rollout_phase
from nemo_jetrl.policy.interfaces import TrainBatch, split_global_batches
from nemo_jetrl.policy.nonfinite import NonFiniteError, NonFiniteStateError, NonFiniteStreakError
from nemo_jetrl.precision.config import precision_line
from nemo_jetrl.precision.kernels import tune_cache
from nemo_jetrl.precision.recipes.gemm_choice import deep_gemm_status
from nemo_jetrl.utils.logger import Logger, NullLogger
from nemo_jetrl.utils.phase_profile import ProfileRequest
from nemo_jetrl.utils.process_env import apply_trainer_env
from nemo_jetrl.utils.progress import RunProgress, run_summary
from nemo_jetrl.utils.python_gc import startup_objects_frozen
from nemo_jetrl.utils.run_lock import lock_run_dirs, release_all
from nemo_jetrl.utils.save_deadline import SaveDeadline
from nemo_jetrl.utils.timers import Timer

console = Console(stderr=True)


def setup(cfg: RunConfig, task: Any | None = None) -> GrpoSetup:
    """Build policy, rollout engine, task and logger from the validated `MasterConfig` (a dict is refused).

    `task`: a ready `VerifiableTask` to use instead of the one `data` / `env` describe.
    """
    cfg = run_config(cfg, "grpo.setup")
    loss_fn = ClippedPGLossFn(cfg.loss_fn)
    placed = place(cfg, init_reference_model=cfg.loss_fn.reference_policy_kl_penalty > 0)
    policy, engine, device = placed.policy, placed.engine, placed.device
    tok = policy.tokenizer
    if task is None:
        limit = max_prompt_length(
            cfg.policy.max_total_sequence_length, cfg.policy.generation.max_new_tokens, cfg.data.max_input_seq_length
        )
        task = make_task(cfg.data, cfg.env, tokenizer=tok, max_prompt_tokens=limit)
    logger = Logger(cfg.logger) if placed.is_main else NullLogger()
    checkpoints = checkpoint_manager(cfg.checkpointing) if cfg.checkpointing.enabled else None
    run = GrpoSetup(cfg, policy, engine, loss_fn, task, logger, checkpoints, device, placed.is_main, placed.startup)
    if cfg.grpo.val_reference:
        check_reference(run)  # refused at start-up, before any rollout
    return run


def _on_nonfinite(run: GrpoSetup, step: int, err: NonFiniteError) -> None:
    """`grpo.on_nonfinite`: `stop` re-raises (the run ends, checkpoints untouched); `skip` reports and goes on.
    Non-finite weights or scales after a step (NonFiniteStateError) always stop: there is nothing to skip back to."""
    if run.cfg.grpo.on_nonfinite == "stop" or isinstance(err, NonFiniteStateError):
        raise err
    console.print(f"[yellow]step {step + 1}: {err}; batch skipped (grpo.on_nonfinite=skip)[/]")
    _guard_state(run)  # the state the next step starts from


def _generate_batch(run: GrpoSetup, batch_index: int, num_prompts: int, timer: Timer) -> Rollout:
    """One generation batch: data batch `batch_index` of `num_prompts` prompts x G samples, scored and shaped."""
    g = run.cfg.grpo
    group = g.num_generations_per_prompt
    tok = run.policy.tokenizer
    with timer.time("generation"):
        problems = run.task.train_batch(batch_index, num_prompts)
        prompt_ids = [ids for ids in encode_prompts(tok, [p.prompt for p in problems]) for _ in range(group)]
        answers = [p.answer for p in problems for _ in range(group)]
        out = run.engine.generate(prompt_ids, generator=step_generator(g.seed, batch_index, run.device))
    for part, seconds in run.engine.rollout_timings().items():  # device time inside the generation phase
        timer.add(f"generation/{part}", seconds)
    with timer.time("reward"):
        raw = run.task.score(decode_responses(tok, out), answers)  # [B]
        num_bad = int((~torch.isfinite(raw)).sum())
        if num_bad:  # before any update: the weights stay as they are
            raise NonFiniteError(f"rewards ({num_bad} of {len(raw)}, from the environment)", run.policy.step)
        raw = scale_rewards(raw, g.reward_scaling)
        rewards = shape_rewards(raw, out.response_lengths.cpu(), out.finished.cpu(), g.reward_shaping)
    return Rollout(out, rewards, raw)


def _collect_rollout(run: GrpoSetup, timer: Timer) -> tuple[Rollout, list[Rollout], dict[str, float]]:
    """The step's training rows (dynamic sampling: several generation batches), every generated batch, metrics."""
    g = run.cfg.grpo
    num_prompts = g.num_prompts_per_step

    def next_batch(size: int) -> Rollout:
        run.next_batch += 1  # consumed even when its rewards turn out non-finite
        return _generate_batch(run, run.next_batch - 1, size, timer)

    if not g.use_dynamic_sampling:
        rollout = next_batch(num_prompts)
        return rollout, [rollout], {}
    return dynamic_sampling(
        lambda: next_batch(int(num_prompts * g.batch_multiplier)),  # NeMo-RL: int(prompts * multiplier)
        num_prompts,
        g.num_generations_per_prompt,
        g.dynamic_sampling_max_gen_batches,
        run.policy.tokenizer.pad_token_id,
    )


def grpo_step(run: GrpoSetup, step: int, timer: Timer, progress: RunProgress) -> dict[str, float]:
    """One GRPO step; returns its metrics (train/... and timing/...)."""
    g = run.cfg.grpo
    group = g.num_generations_per_prompt

    if needs_kv_bootstrap(run):
        progress.phase("kv_bootstrap")
        with timer.time("kv_bootstrap"):
            bootstrap_kv_scales(run, step)

    progress.phase("generation")
    try:
        with rollout_phase(run.engine):
            train, generated, ds_metrics = _collect_rollout(run, timer)
    except NonFiniteError as err:
        env_counts = env_metrics(run.task)
        _on_nonfinite(run, step, err)
        return {**env_counts, "nonfinite_skipped": 1.0}
    env_counts = env_metrics(run.task)
    with timer.time("reward"):
        advantages = group_advantages(
            train.rewards, group, leave_one_out=g.use_leave_one_out_baseline, normalize_std=g.normalize_rewards
        )
    out = train.out
    response_mask = overlong_filter(out.response_mask, out.finished) if g.overlong_filtering else out.response_mask
    batch = TrainBatch(
        input_ids=out.input_ids.cpu(),
        attention_mask=out.attention_mask.cpu(),
        response_mask=response_mask.cpu(),
        advantages=advantages.float(),
        generation_logprobs=out.generation_logprobs.float().cpu(),
        generation_routing=None if out.routed_experts is None else out.routed_experts.cpu(),
    )

    progress.phase("logprobs")
    keep = torch.ones(len(batch), dtype=torch.bool)
    if g.drop_zero_advantage_groups:
        keep = ~zero_std_groups(train.rewards, group)
    # train_forward: the training forward yields prev_logprobs (one forward less); a step with no row to train
    # still gets them from a logprob forward, for the mismatch metrics and the KV calibration
    from_train = run.cfg.policy.prev_logprobs_source == "train_forward" and bool(keep.any())
    with timer.time("logprobs"):
        if not from_train:  # always the trainer's own forward, never a replay of the rollout (docs/mismatch.md)
            batch.prev_logprobs = run.policy.get_logprobs(batch)
        if run.policy.has_reference:
            batch.reference_logprobs = run.policy.get_reference_policy_logprobs(batch)
        bad = _nonfinite_logprobs(batch)
        if bad is not None:  # e.g. a temperature so small that logits / temperature overflow
            _on_nonfinite(run, step, NonFiniteError(bad, run.policy.step))
            return {**env_counts, "nonfinite_skipped": 1.0}
    metrics = nemo_rl_rollout_metrics(generated, train, advantages, g.use_dynamic_sampling)
    metrics.update(
        reward_mean=metrics["reward"],
        accuracy=float((torch.cat([r.raw_rewards for r in generated]) > 0.5).float().mean()),
        mean_response_length=metrics["mean_gen_tokens_per_sample"],
        truncated_fraction=metrics["truncation_rate"],
        **ds_metrics,
        **env_counts,
    )
    if not from_train:
        metrics.update(
            step_mismatch_metrics(
                batch.prev_logprobs, batch.generation_logprobs, batch.response_mask, g.mismatch_position_bin
            )
        )
    metrics["kept_fraction"] = float(keep.float().mean())
    progress.phase("training")
    metrics["nonfinite_skipped"] = 0.0
    with timer.time("training"):  # one optimizer step per train_global_batch_size rows, then one LR step
        try:
            steps = split_global_batches(batch, run.cfg.policy.train_global_batch_size, keep)
            metrics.update(run.policy.train(steps, run.loss_fn))
            if from_train:  # over the trained rows: the forward whose gradient was taken
                trained = steps[0]
                metrics.update(
                    step_mismatch_metrics(
                        trained.prev_logprobs,
                        trained.generation_logprobs,
                        trained.response_mask,
                        g.mismatch_position_bin,
                    )
                )
        except NonFiniteError as err:  # raised before the optimizer touched the weights (of that optimizer step)
            _on_nonfinite(run, step, err)
            metrics["nonfinite_skipped"] = 1.0
    progress.phase("refit")
    with timer.time("refit"):
        metrics.update({f"refit/{k}": v for k, v in run.policy.prepare_refit().items()})
        _guard_state(run)  # before the new weights / scales reach the rollout or a checkpoint
        # the refit: engines that hold their own copy (vLLM) re-read the weights; recalibrated FP8 KV scales go along
        kv_scales = run.policy.kv_scales
        run.engine.update_weights(kv_scales=kv_scales.kv if kv_scales is not None else None)
    return metrics


def _nonfinite_logprobs(batch: TrainBatch) -> str | None:
    """Which logprobs of the generated tokens hold NaN/Inf ("rollout logprobs (3 tokens)"), or None."""
    mask = batch.response_mask.bool()
    named = (
        ("rollout", batch.generation_logprobs),
        ("trainer", batch.prev_logprobs),
        ("reference", batch.reference_logprobs),
    )
    for name, logprobs in named:
        if logprobs is not None:
            bad = int((~torch.isfinite(logprobs[mask])).sum())
            if bad:
                return f"{name} logprobs ({bad} of {int(mask.sum())} generated tokens)"
    return None


def _guard_state(run: GrpoSetup) -> None:
    """Master weights, FP8 weight scales and KV scales after this step (trained or not) are finite, or the run
    stops (NonFiniteStateError): nothing non-finite reaches the rollout or a checkpoint."""
    bad = run.policy.nonfinite_state()
    if bad is not None:
        raise NonFiniteStateError(bad, run.policy.step)


def run_grpo(cfg: RunConfig, resolved: DictConfig | None = None, *, task: Any | None = None) -> dict[str, Any]:
    """Entry point used by examples/run_grpo.py: the validated `MasterConfig` (a dict is refused), kept typed to
    the end of the run. Returns the run's history (for tests and scripts).

    `task`: a `VerifiableTask` to train on instead of the one the config's `data` / `env` sections build.

    Locks `logger.log_dir` and `checkpointing.checkpoint_dir` for the run (a second writer is refused), checks
    them, the device and the data before the first step (`preflight`), and the step's memory before anything
    (`memory_preflight`: derived token budgets, or a refusal naming the keys). With `checkpointing.enabled`, resumes from
    the latest valid checkpoint in `checkpoint_dir` (model, optimizer, RNG states, step; metrics.jsonl trimmed to
    that step) and saves one every `save_period` steps, and at `checkpoint_must_save_by` (then stops).
    """
    cfg = run_config(cfg, "run_grpo")
    deadline = SaveDeadline(cfg.checkpointing.checkpoint_must_save_by)  # counted from the process's start
    env_lines = apply_trainer_env(cfg.policy.dtensor_cfg)  # before this process starts CUDA where it can
    main = start_ranks(cfg)  # torchrun: this rank's process group; rank 0 alone writes and prints
    for out in (console, checkpoint_console):
        out.quiet = out.quiet or not main
    for env_line in env_lines:
        console.print(env_line, highlight=False, soft_wrap=True)
    memory = memory_preflight(cfg)  # may derive token budgets into cfg (every rank alike), or refuse
    console.print(memory.line, highlight=False, soft_wrap=True)
    locks = []
    if main:
        check_output_dirs(cfg)
        locks = lock_run_dirs(output_dirs(cfg))
    line = precision_line(cfg.policy)
    try:
        return _run_locked(cfg, resolved, task, line, main, memory_estimates(memory), deadline)
    finally:
        release_all(locks)


def _run_locked(
    cfg: RunConfig,
    resolved: DictConfig | None,
    task: Any | None,
    line: str | None,
    main: bool,
    memory: dict[str, float],
    deadline: SaveDeadline,
) -> dict[str, Any]:
    resume = load_resume_state(cfg) if main else None  # rank 0 first: it may move an earlier run's outputs aside
    sync_ranks(cfg)
    if not main:  # then the other ranks read the same checkpoint
        resume = load_resume_state(cfg, writer=False)
    run = setup(cfg, task)
    if main:
        check_checkpoint_space(cfg, run.policy.parameter_bytes())
    check_validation_set(cfg, run.task)
    run.logger.log_config(OmegaConf.to_container(resolved, resolve=True) if resolved is not None else cfg.model_dump())
    start_step = restore(run, resume) if resume is not None else 0
    if start_step == 0 and memory and run.device.type == "cuda":  # the estimate, beside memory/<phase>_peak_gib
        run.logger.log_metrics(memory, step=0)
    if resume is not None:  # an engine holding its own weight copy (vLLM) takes the restored ones
        run.engine.update_weights()
    for text in (line, run.startup):
        if text is not None:
            console.print(text, highlight=False)
    console.print(
        f"fp8 layers: {sum(v == 'fp8' for v in run.policy.layer_map.values())}/{len(run.policy.layer_map)} | "
        f"device {run.device}"
    )
    if run.policy.recipe.use_deep_gemm and run.policy.recipe.linear_fp8:
        console.print(deep_gemm_status(run.policy.recipe, run.device), highlight=False)
    history: list[dict[str, float]] = []
    val_history: list[dict[str, float]] = []
    t0 = time.perf_counter()
    try:
        with startup_objects_frozen():  # collections during the steps skip start-up's objects
            _train_loop(run, start_step, history, val_history, deadline)
    except NonFiniteError:
        console.print("[red]run stopped on non-finite values; saved checkpoints are untouched[/]")
        raise
    finally:
        run.logger.close()  # draws the final plots
    wall = time.perf_counter() - t0
    summary = run_summary(history, val_history, wall)
    console.print(summary)
    return {"history": history, "validation": val_history, "summary": summary, "wall_time_s": wall}


def _train_loop(run: GrpoSetup, start_step: int, history: list, val_history: list, deadline: SaveDeadline) -> None:
    """Steps `start_step .. max_num_steps - 1` with logging, validation and checkpoints;
    `grpo.max_consecutive_nonfinite_skips` steps skipped as non-finite in a row stop the run (before a save); a step
    after which the next would pass `checkpoint_must_save_by` saves (checkpointing enabled) and stops the run."""
    cfg, g = run.cfg, run.cfg.grpo
    max_steps, val_period = g.max_num_steps, g.val_period
    skip_limit, skipped_in_a_row = g.max_consecutive_nonfinite_skips, 0
    profile = ProfileRequest.from_env(run.logger.log_dir) if run.is_main else None  # NEMO_JETRL_PROFILE
    with RunProgress(max_steps, enabled=None if run.is_main else False) as progress:
        progress.advance(step=start_step)
        if g.val_at_start and val_period > 0 and start_step == 0:
            progress.phase("validation")
            val = validate(run, 0)
            val_history.append(val)
            run.logger.log_metrics(val, step=0, prefix="validation/")
        deadline.start_steps()
        for step in range(start_step, max_steps):
            profiler = profile.for_step(step + 1) if profile is not None else None
            timer = Timer(memory_device=run.device, profile=profiler)  # CUDA: each phase's peak memory too
            with timer.time("total_step_time"):
                metrics = grpo_step(run, step, timer, progress)
            logged = run.logger.log_metrics(metrics, step=step + 1, prefix="train/")
            timing = timer.get_timing_metrics()
            run.logger.log_metrics({**timing, **nemo_rl_timing(timing), **timer.get_memory_metrics()}, step=step + 1)
            history.append(metrics)
            periodic = val_period > 0 and (step + 1) % val_period == 0
            if periodic or (g.val_at_end and step + 1 == max_steps):  # NeMo-RL's val_at_end: the last step too
                progress.phase("validation")
                val = validate(run, step + 1)
                val_history.append(val)
                logged.update(run.logger.log_metrics(val, step=step + 1, prefix="validation/"))
            if run.is_main:  # the timed kernel picks the step's and its validation's rollouts took (the start's too)
                tune_cache.record_used_picks(run.logger.log_dir)
            skipped = metrics.get("nonfinite_skipped") == 1.0
            skipped_in_a_row = skipped_in_a_row + 1 if skipped else 0
            if skip_limit is not None and skipped_in_a_row >= skip_limit:
                raise NonFiniteStreakError(skipped_in_a_row, step + 1)
            stop = deadline.step_done(run.device)  # as NeMo-RL: save every save_period steps, at the last and to stop
            due = stop or (step + 1) % cfg.checkpointing.save_period == 0 or step + 1 == max_steps
            if run.checkpoints is not None and due:
                progress.phase("checkpoint")
                state = checkpoint_state(run, step + 1)  # collective on several ranks; rank 0 holds the state
                if run.is_main:
                    run.checkpoints.save(step + 1, state, metrics=checkpoint_metrics(metrics, val_history))
            progress.advance(step=step + 1, metrics=logged)
            run.logger.maybe_plot(step + 1)
            if stop:
                console.print(deadline.stop_line(step + 1, run.checkpoints is not None), soft_wrap=True)
                break
