"""NeMo-RL's GRPO config keys that are not fields of our schema, one line each: honoured (mapped onto our key),
accepted without effect (with the reason; `announced` ones say so in one start-up line), refused for the values this
implementation cannot honour, or mapped by the Megatron pass (`megatron`). The `policy.*` lines are in
nemo_rl_policy_keys.py.

A key that is a field of our schema is honoured as is and never looked up here (tests/unit/config keep the two
apart). Patterns use `*` (any rest of the dotted path) and apply to the keys NeMo-RL defines at the pinned commit
(nemo_rl_defined_keys.txt); the first matching line wins, so exact keys come first. Every key NeMo-RL defines has a
line or a field (a test holds it). The docs table (docs/nemo_rl.md) is written from these lines.
"""

from __future__ import annotations

from nemo_jetrl.config.nemo_rl_policy_keys import DATA_PLANE, MULTIMODAL, POLICY_RULES
from nemo_jetrl.config.nemo_rl_rules import Rule, alias, announced, no_effect, only

PREFERENCE = "preference-data (DPO / RM) keys: a GRPO run does not read them"
SYNC = (
    "runs synchronously and on-policy here (async GRPO is not built): each step trains on rollouts of the current "
    "weights"
)
OTHER_ENV = "an environment section: read only when data.*.env_name names it (math is the one run here)"

GENERAL_RULES: dict[str, Rule] = {
    # ---- grpo -------------------------------------------------------------------------------------------------
    "grpo.max_rollout_turns": only([1], "multi-turn rollouts", "single-turn environments only: set 1"),
    "grpo.max_num_epochs": no_effect("runs stop at grpo.max_num_steps; the data loader cycles over epochs"),
    "grpo.val_start_at": only([-1, 0, None], "delayed validation", "remove it (validation every grpo.val_period)"),
    "grpo.val_num_generations_per_prompt": only([1], "pass@k validation", "set 1"),
    "grpo.val_batch_size": no_effect("memory / speed tuning of an engine this implementation does not use"),
    "grpo.stop_at_validation_metric": only([None], "early stopping", "remove it"),
    "grpo.stop_at_validation_threshold": no_effect("read only with grpo.stop_at_validation_metric"),
    "grpo.advantage_clip_low": only([None], "advantage clipping", "set null"),
    "grpo.advantage_clip_high": only([None], "advantage clipping", "set null"),
    "grpo.adv_estimator.name": only(["grpo"], "other advantage estimators", "set grpo"),
    "grpo.adv_estimator.normalize_rewards": alias("grpo.normalize_rewards"),
    "grpo.adv_estimator.use_leave_one_out_baseline": alias("grpo.use_leave_one_out_baseline"),
    "grpo.adv_estimator.*": no_effect("Reinforce++ settings; grpo.adv_estimator.name is grpo"),
    "grpo.seq_logprob_error_threshold": only([None], "sequence masking by logprob error", "set null"),
    "grpo.invalid_tool_call_advantage": only([None], "tool-call environments", "set null"),
    "grpo.malformed_thinking_advantage": only([None], "tool-call environments", "set null"),
    "grpo.penalize_invalid_tool_call": only([False, None], "tool-call environments", "set false"),
    "grpo.penalize_malformed_thinking": only([False, None], "tool-call environments", "set false"),
    "grpo.invalid_tool_call_strategy": no_effect("tool-call environments only"),
    "grpo.async_grpo.enabled": announced([False, None], SYNC),
    "grpo.async_grpo.*": no_effect("async GRPO settings (runs synchronously here)"),
    "grpo.calculate_advantages_on_gpu": no_effect("where the advantages are computed (same numbers)"),
    "grpo.debug_payload_metrics": no_effect("NeMo-RL's payload debug metrics"),
    "grpo.deduplicate_multimodal_data": no_effect(MULTIMODAL),
    "grpo.skip_reference_policy_logprobs_calculation": no_effect(
        "reference logprobs are computed only when loss_fn.reference_policy_kl_penalty > 0"
    ),
    "async_rl.*": no_effect(f"NeMo-RL's single-controller async loop settings; {SYNC}"),
    "reward_penalties.token_ids.*": no_effect("read only with a reward_penalties.penalize_* switch on"),
    "reward_penalties.*": only([False, None], "NeMo-Gym reward penalties", "set false"),
    "data_plane.enabled": announced(
        [False, None], "NeMo-RL's TransferQueue data plane moves tensors between its processes; here the driver and "
        "the workers exchange them directly (same numbers)"
    ),  # fmt: skip
    "data_plane.*": no_effect(DATA_PLANE),
    "on_policy_distillation": only([None], "on-policy distillation", "set null"),
    "on_policy_distillation.enabled": only([False], "on-policy distillation", "set false"),
    "on_policy_distillation.*": no_effect("read only with on_policy_distillation.enabled: true"),
    # ---- loss_fn ----------------------------------------------------------------------------------------------
    "loss_fn.use_kl_in_reward": only([False], "KL in the reward (Reinforce++)", "set false"),
    "loss_fn.use_cispo": only([False], "CISPO", "set false"),
    "loss_fn.disable_ppo_ratio": only([False], "REINFORCE without the PPO ratio", "set false"),
    "loss_fn.positive_example_nll_weight": only([0, 0.0], "the VAPO NLL term", "set 0.0"),
    # ---- data -------------------------------------------------------------------------------------------------
    "data.train": only([], "a list of training datasets, or none", "name one (data.train.dataset_name)"),
    "data.train.dataset_name": alias("data.dataset_name"),
    "data.train.data_path": alias("data.dataset_name"),
    "data.train.seed": alias("data.seed"),
    "data.train.input_key": alias("data.input_key"),
    "data.train.output_key": alias("data.output_key"),
    "data.train.split": alias("data.train_split"),
    "data.train.subset": alias("data.dataset_config"),
    "data.validation": only(
        [None, {}], "a list of validation datasets", "name one (data.validation.dataset_name); null: data.val_size "
        "rows of the training data are held out"
    ),  # fmt: skip
    "data.validation.dataset_name": alias("data.val_dataset_name"),
    "data.validation.data_path": alias("data.val_dataset_name"),
    "data.validation.split": alias("data.val_split"),
    "data.validation.input_key": alias("data.input_key", reason="one key for training and validation rows"),
    "data.validation.output_key": alias("data.output_key", reason="one key for training and validation rows"),
    "data.validation.subset": alias("data.dataset_config", reason="one HF config for training and validation"),
    "data.validation.seed": no_effect("data.seed shuffles and splits both"),
    "data.validation.repeat": no_effect("validation runs each held-out prompt once (grpo.max_val_samples prompts)"),
    "data.default.*": no_effect(
        "settings of every dataset: merged into data.train and data.validation first, their own keys winning "
        "(config/nemo_rl_values.py)"
    ),
    "data.*.prompt_file": alias("data.prompt_template", read_file=True),
    "data.*.system_prompt_file": alias("data.system_prompt", read_file=True),
    "data.*.processor": only(
        ["math_hf_data_processor", "math_data_processor"], "other data processors", "use math_hf_data_processor"
    ),
    "data.*.env_name": only(["math"], "environments other than math", "set math"),
    "data.*.split_validation_size": no_effect("data.val_size rows are held out (a count, default 512)"),
    "data.*.download_dir": no_effect("datasets are read from local files or the HF cache"),
    "data.*.min_generation_tokens": no_effect("a multimodal prompt-length guard"),
    "data.*.num_frames": no_effect(MULTIMODAL),
    "data.*.video_*": no_effect(MULTIMODAL),
    "data.*.prompt_key": no_effect(PREFERENCE),
    "data.*.chosen_key": no_effect(PREFERENCE),
    "data.*.rejected_key": no_effect(PREFERENCE),
    "data.num_workers": no_effect("data loading speed only"),
    "data.use_multiple_dataloader": only([False], "multiple dataloaders", "set false"),
    "data.num_prompts_per_dataloader": no_effect("read only with data.use_multiple_dataloader: true"),
    "data.custom_dataloader": only([None], "custom dataloaders", "remove it"),
    "data.add_generation_prompt": only([True], "prompts without the assistant header", "set true"),
    "data.add_system_prompt": no_effect("a system message is added when data.system_prompt(_file) is set"),
    "data.add_bos": no_effect("the tokenizer adds its BOS once (data/prompts.py)"),
    "data.add_eos": no_effect("prompts end with the assistant header; generation ends at the stop token"),
    "data.prompt_file": alias("data.prompt_template", read_file=True),
    "data.system_prompt_file": alias("data.system_prompt", read_file=True),
    # ---- env --------------------------------------------------------------------------------------------------
    "env.math.num_workers": no_effect("verification runs in the driver process"),
    "env.math.stop_strings": only([None, []], "stop strings", "use policy.generation.stop_token_ids"),
    "env.math.verifier_type": only([None, "math"], "multiple-choice verifiers", "remove it (math answers)"),
    "env.*": no_effect(OTHER_ENV),
    # ---- logger / checkpointing / cluster ---------------------------------------------------------------------
    "logger.num_val_samples_to_print": no_effect("console output only"),
    "logger.monitor_gpus": no_effect("GPU monitoring is not logged here"),
    "logger.gpu_monitoring.*": no_effect("GPU monitoring is not logged here"),
    "logger.swanlab_enabled": only([False], "SwanLab logging", "use TensorBoard, W&B or MLflow"),
    "logger.swanlab.*": no_effect("read only with logger.swanlab_enabled: true"),
    "logger.tensorboard*": no_effect("TensorBoard writes under logger.log_dir"),
    "logger.wandb.log_nemo_gym_full_result_tables": no_effect("NeMo-Gym only"),
    "logger.wandb.entity": no_effect("W&B logs to the logged-in account's default entity"),
    "logger.mlflow.run_name": no_effect("MLflow run names come from the log dir"),
    "logger.mlflow.*": no_effect("MLflow logs to a new run of logger.mlflow.experiment_name"),
    "checkpointing.model_save_format": no_effect(
        "checkpoints hold torch tensors; examples/export_hf.py writes safetensors"
    ),
    "checkpointing.save_consolidated": no_effect("examples/export_hf.py writes a consolidated HF model"),
    "checkpointing.save_optimizer": only([True], "weights-only checkpoints", "set true (resume needs the optimizer)"),
    "checkpointing.is_async": no_effect("checkpoint I/O timing"),
    "checkpointing.is_peft": only([False, None], "PEFT checkpoints", "set false"),
    "checkpointing.peft_config*": no_effect("read only with checkpointing.is_peft: true"),
    "checkpointing.ft_*": no_effect("NeMo-RL's fault-tolerance saves; checkpoints every save_period steps here"),
    "checkpointing.model_cache_dir": no_effect("models load from policy.model_name"),
    "checkpointing.model_repo_id": no_effect("models load from policy.model_name"),
    "checkpointing.pretrained_checkpoint*": only([None], "starting from a Megatron checkpoint", "use policy.model_name"),
    "cluster.master_port_range_*": no_effect("Ray / torch.distributed choose ports"),
    "cluster.segment_size": no_effect("NVLink topology alignment"),
}

KEY_RULES: dict[str, Rule] = {**GENERAL_RULES, **POLICY_RULES}
