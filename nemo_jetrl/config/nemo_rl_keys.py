"""NeMo-RL's GRPO config keys that are not fields of our schema, one line each: honoured (mapped onto our key),
accepted without effect (with the reason), or refused for the values this implementation cannot honour.

A key that is a field of our schema is honoured as is and never looked up here (tests/unit/config keep the two
apart). Patterns use `*` (any rest of the dotted path); the first matching line wins, so exact keys come first.
The docs table (docs/nemo_rl.md) is written from these lines.
"""

from __future__ import annotations

from nemo_jetrl.config.nemo_rl_rules import Rule, alias, no_effect, only, same_as

DENSE = "dense models: MoE options do nothing"
MEMORY = "memory / speed tuning of an engine this implementation does not use"
VLLM = "vLLM engine setting the adapter (generation/vllm_engine.py) sets itself or leaves at vLLM's default"
MEGATRON_OFF = "read by NeMo-RL only with policy.megatron_cfg.enabled: true"
DATA_PLANE = "NeMo-RL's data plane / transport; one process or Ray workers exchange tensors directly here"
BOTH_SIDES = "one layer map: these layers stay BF16 on trainer AND rollout (NeMo-RL: rollout only)"
KV_FRACTION = "the fraction of the GPU memory the colocated trainer leaves free (its state stays resident)"
ONE_TRAINER = (
    "use cluster.num_nodes / gpus_per_node (data-parallel FSDP2 workers) and policy.dtensor_cfg.tensor_parallel_size"
)

KEY_RULES: dict[str, Rule] = {
    # ---- grpo -------------------------------------------------------------------------------------------------
    "grpo.max_rollout_turns": only([1], "multi-turn rollouts", "single-turn environments only: set 1"),
    "grpo.max_num_epochs": no_effect("runs stop at grpo.max_num_steps; the data loader cycles over epochs"),
    "grpo.val_start_at": only([-1, 0, None], "delayed validation", "remove it (validation every grpo.val_period)"),
    "grpo.val_at_end": only([False], "a validation after the last step", "set grpo.val_period to divide max_num_steps"),
    "grpo.val_num_generations_per_prompt": only([1], "pass@k validation", "set 1"),
    "grpo.val_batch_size": no_effect(MEMORY),
    "grpo.stop_at_validation_metric": only([None], "early stopping", "remove it"),
    "grpo.stop_at_validation_threshold": no_effect("read only with grpo.stop_at_validation_metric"),
    "grpo.advantage_clip_low": only([None], "advantage clipping", "set null"),
    "grpo.advantage_clip_high": only([None], "advantage clipping", "set null"),
    "grpo.adv_estimator.name": only(["grpo"], "other advantage estimators", "set grpo"),
    "grpo.adv_estimator.normalize_rewards": alias("grpo.normalize_rewards"),
    "grpo.adv_estimator.use_leave_one_out_baseline": alias("grpo.use_leave_one_out_baseline"),
    "grpo.adv_estimator.*": no_effect("Reinforce++ settings; grpo.adv_estimator.name is grpo"),
    "grpo.reward_scaling.enabled": only([False], "reward scaling", "set false"),
    "grpo.reward_scaling.*": no_effect("read only with grpo.reward_scaling.enabled: true"),
    "grpo.seq_logprob_error_threshold": only([None], "sequence masking by logprob error", "set null"),
    "grpo.invalid_tool_call_advantage": only([None], "tool-call environments", "set null"),
    "grpo.malformed_thinking_advantage": only([None], "tool-call environments", "set null"),
    "grpo.async_grpo.enabled": only([False], "async GRPO", "set false (on-policy synchronous GRPO)"),
    "grpo.async_grpo.*": no_effect("read only with grpo.async_grpo.enabled: true"),
    "reward_penalties.*": only([False, None], "NeMo-Gym reward penalties", "set false"),
    "data_plane.enabled": only([False], "NeMo-RL's TransferQueue data plane", "set false"),
    "data_plane.*": no_effect(DATA_PLANE),
    "on_policy_distillation": only([None], "on-policy distillation", "set null"),
    # ---- loss_fn ----------------------------------------------------------------------------------------------
    "loss_fn.force_on_policy_ratio": only([False], "forced ratio 1", "set false"),
    "loss_fn.use_kl_in_reward": only([False], "KL in the reward (Reinforce++)", "set false"),
    "loss_fn.use_cispo": only([False], "CISPO", "set false"),
    "loss_fn.disable_ppo_ratio": only([False], "REINFORCE without the PPO ratio", "set false"),
    "loss_fn.positive_example_nll_weight": only([0, 0.0], "the VAPO NLL term", "set 0.0"),
    # ---- policy -----------------------------------------------------------------------------------------------
    "policy.tokenizer.chat_template_kwargs": only([None, {}], "chat-template kwargs", "set null"),
    "policy.tokenizer.use_fastokens": no_effect("tokenizer speed only"),
    "policy.hf_config_overrides": only([None, {}], "model config overrides", "edit the model's config.json"),
    "policy.generation_batch_size": no_effect("NeMo-RL's HF generation backend only"),
    "policy.logprob_chunk_size": no_effect(MEMORY),
    "policy.offload_optimizer_for_logprob": no_effect(MEMORY),
    "policy.make_sequence_length_divisible_by": no_effect("padding only; the trainer masks padded tokens"),
    "policy.optimizer.kwargs.lr": alias("policy.optimizer.lr"),
    "policy.optimizer.kwargs.weight_decay": alias("policy.optimizer.weight_decay"),
    "policy.optimizer.kwargs.betas": alias("policy.optimizer.betas"),
    "policy.optimizer.kwargs.eps": alias("policy.optimizer.eps"),
    "policy.optimizer.kwargs.foreach": no_effect("implementation choice of torch's AdamW (same update)"),
    "policy.optimizer.kwargs.fused": no_effect("implementation choice of torch's AdamW (same update)"),
    "policy.optimizer.kwargs.amsgrad": only([False], "AMSGrad", "set false"),
    "policy.dtensor_cfg.enabled": no_effect("the trainer here is always FSDP2 (DTensor)"),
    "policy.dtensor_cfg._v2": no_effect("NeMo-RL's DTensor worker version"),
    "policy.dtensor_cfg.cpu_offload": no_effect(MEMORY),
    "policy.dtensor_cfg.sequence_parallel": only([False], "sequence parallelism", ONE_TRAINER),
    "policy.dtensor_cfg.context_parallel_size": only([1], "context parallelism", ONE_TRAINER),
    "policy.dtensor_cfg.custom_parallel_plan": only([None], "custom parallel plans", "set null"),
    "policy.dtensor_cfg.automodel_kwargs*": no_effect("NeMo Automodel loading options; models load from HF files"),
    "policy.dtensor_cfg.lora_cfg.enabled": only([False], "LoRA", "set false (full fine-tuning)"),
    "policy.dtensor_cfg.lora_cfg.*": no_effect("read only with lora_cfg.enabled: true"),
    "policy.dtensor_cfg.clear_cache_every_n_steps": no_effect(MEMORY),
    "policy.dtensor_cfg.env_vars*": no_effect("environment of NeMo-RL's workers"),
    # megatron_cfg: the FP8 switches are honoured; the backend itself is refused (its optimizer and schedule differ)
    "policy.megatron_cfg.enabled": only(
        [False], "the Megatron trainer", "set false (FSDP2 trainer; megatron_cfg.fp8_cfg still selects FP8 training)"
    ),
    "policy.megatron_cfg.fp8_cfg.enabled": alias("policy.precision", {True: "fp8", False: None}),
    "policy.megatron_cfg.fp8_cfg.fp8": only(["e4m3"], "FP8 formats other than E4M3", "set e4m3"),
    "policy.megatron_cfg.fp8_cfg.fp8_recipe": alias(
        "policy.fp8_cfg.fp8_recipe",
        {"blockwise": "blockwise", "tensorwise": "tensorwise", "rowwise": "rowwise"},
        refused={
            "mxfp8": "MXFP8 (E8M0 scales per 1x32) needs Blackwell's block-scaled tensor cores; Hopper has none",
            "delayed": "delayed scaling takes scales from an amax history of earlier steps; every cast here "
            "scales by its own current amax (use tensorwise)",
        },
    ),
    "policy.megatron_cfg.fp8_cfg.fp8_param": only(
        [False], "FP8 parameter storage", "set false (FP32 master weights, policy.master_dtype)"
    ),
    "policy.megatron_cfg.tensor_model_parallel_size": only([1], "tensor parallelism", ONE_TRAINER),
    "policy.megatron_cfg.pipeline_model_parallel_size": only([1], "pipeline parallelism", ONE_TRAINER),
    "policy.megatron_cfg.context_parallel_size": only([1], "context parallelism", ONE_TRAINER),
    "policy.megatron_cfg.expert_model_parallel_size": only([1], "expert parallelism", ONE_TRAINER),
    "policy.megatron_cfg.expert_tensor_parallel_size": only([1], "expert parallelism", ONE_TRAINER),
    "policy.megatron_cfg.sequence_parallel": only([False], "sequence parallelism", ONE_TRAINER),
    "policy.megatron_cfg.*": no_effect(MEGATRON_OFF),
    "policy.draft.enabled": only([False], "speculative-decoding drafts", "set false"),
    "policy.draft.*": no_effect("read only with policy.draft.enabled: true"),
    # ---- policy.generation ------------------------------------------------------------------------------------
    "policy.generation.vllm_cfg.precision": alias("policy.generation.precision", {"bfloat16": "bf16", "fp8": "fp8"}),
    "policy.generation.vllm_cfg.kv_cache_dtype": alias(
        "policy.generation.kv_cache_dtype", {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8"}
    ),
    "policy.generation.vllm_cfg.num_first_layers_in_bf16": alias(
        "policy.fp8_cfg.num_first_layers_in_bf16", reason=BOTH_SIDES
    ),
    "policy.generation.vllm_cfg.num_last_layers_in_bf16": alias(
        "policy.fp8_cfg.num_last_layers_in_bf16", reason=BOTH_SIDES
    ),
    "policy.generation.vllm_cfg.pow2_weight_scaling_factors": alias("policy.fp8_cfg.pow2_weight_scaling_factors"),
    "policy.generation.vllm_cfg.pow2_activation_scaling_factors": alias(
        "policy.fp8_cfg.pow2_activation_scaling_factors"
    ),
    "policy.generation.vllm_cfg.enforce_eager": alias("policy.generation.cuda_graphs", {True: False, False: True}),
    "policy.generation.vllm_cfg.use_deep_gemm": alias(
        "policy.fp8_cfg.use_deep_gemm",
        reason="one GEMM library for trainer AND rollout, where deep_gemm imports on an sm90 GPU",
    ),
    "policy.generation.vllm_cfg.async_engine": only([False], "the async rollout engine", "set false"),
    "policy.generation.vllm_cfg.tensor_parallel_size": same_as(
        "policy.dtensor_cfg.tensor_parallel_size",
        1,
        "a rollout TP other than the trainer's",
        "the native rollout runs colocated on the trainer's tensor-parallel ranks; set both to the same value",
    ),
    "policy.generation.vllm_cfg.pipeline_parallel_size": only([1], "rollout pipeline parallelism", ONE_TRAINER),
    "policy.generation.vllm_cfg.expert_parallel_size": only([1], "expert parallelism", ONE_TRAINER),
    "policy.generation.vllm_cfg.logprobs_mode": only(["processed_logprobs"], "raw logprobs", "set processed_logprobs"),
    "policy.generation.vllm_cfg.max_model_len": alias("policy.generation.max_model_len"),
    "policy.generation.vllm_cfg.gpu_memory_utilization": alias(
        "policy.generation.gpu_memory_utilization", reason=KV_FRACTION
    ),
    "policy.generation.vllm_kwargs.max_num_seqs": alias("policy.generation.max_num_seqs"),
    "policy.generation.vllm_kwargs.kv_cache_memory_bytes": alias("policy.generation.kv_cache_memory_bytes"),
    "policy.generation.vllm_kwargs.block_size": alias("policy.generation.kv_block_size"),
    "policy.generation.vllm_cfg.*": no_effect(VLLM),
    "policy.generation.vllm_kwargs*": no_effect(VLLM),
    "policy.generation.stop_strings": only([None, []], "stop strings", "use policy.generation.stop_token_ids"),
    "policy.generation.val_temperature": no_effect("validation samples at policy.generation.temperature"),
    "policy.generation.val_top_p": no_effect("validation samples at policy.generation.top_p"),
    "policy.generation.val_top_k": no_effect("validation samples at policy.generation.top_k"),
    "policy.generation.colocated.enabled": only(
        [True], "non-colocated generation", "set true (each worker trains and generates)"
    ),
    "policy.generation.colocated.*": no_effect("read only with colocated.enabled: false"),
    "policy.generation.port_range_*": no_effect(DATA_PLANE),
    "policy.generation.refit_*": no_effect(DATA_PLANE),
    "policy.generation.real_quant_export_cpu_offload": no_effect(DATA_PLANE),
    "policy.generation.mcore_generation_config.*": no_effect("Megatron generation backend settings"),
    # ---- data / env -------------------------------------------------------------------------------------------
    "data.train.dataset_name": alias("data.dataset_name"),
    "data.train.data_path": alias("data.dataset_name"),
    "data.train.seed": alias("data.seed"),
    "data.train.input_key": alias("data.input_key"),
    "data.train.output_key": alias("data.output_key"),
    "data.train.split": alias("data.train_split"),
    "data.validation": no_effect("null: data.val_size rows of the training data are held out"),
    "data.validation.dataset_name": alias("data.val_dataset_name"),
    "data.validation.data_path": alias("data.val_dataset_name"),
    "data.validation.split": alias("data.val_split"),
    "data.default.dataset_name": alias("data.dataset_name"),
    "data.default.input_key": alias("data.input_key"),
    "data.default.output_key": alias("data.output_key"),
    "data.*.prompt_file": alias("data.prompt_template", read_file=True),
    "data.*.system_prompt_file": alias("data.system_prompt", read_file=True),
    "data.*.processor": only(
        ["math_hf_data_processor", "math_data_processor"], "other data processors", "use math_hf_data_processor"
    ),
    "data.*.env_name": only(["math"], "environments other than math", "set math"),
    "data.train.split_validation_size": no_effect("data.val_size rows are held out (a count, default 512)"),
    "data.num_workers": no_effect("data loading speed only"),
    "data.use_multiple_dataloader": only([False], "multiple dataloaders", "set false"),
    "data.prompt_file": alias("data.prompt_template", read_file=True),
    "data.system_prompt_file": alias("data.system_prompt", read_file=True),
    "env.math.num_workers": no_effect("verification runs in the driver process"),
    "env.math.math_verify_impl": only(["hf_math_verify"], "other verifiers", "set hf_math_verify"),
    # ---- logger / checkpointing / cluster ---------------------------------------------------------------------
    "logger.num_val_samples_to_print": no_effect("console output only"),
    "logger.monitor_gpus": no_effect("GPU monitoring is not logged here"),
    "logger.gpu_monitoring.*": no_effect("GPU monitoring is not logged here"),
    "logger.swanlab_enabled": only([False], "SwanLab logging", "use TensorBoard, W&B or MLflow"),
    "logger.swanlab.*": no_effect("read only with logger.swanlab_enabled: true"),
    "logger.tensorboard*": no_effect("TensorBoard writes under logger.log_dir"),
    "logger.wandb.log_nemo_gym_full_result_tables": no_effect("NeMo-Gym only"),
    "logger.mlflow.run_name": no_effect("MLflow run names come from the log dir"),
    "checkpointing.checkpoint_must_save_by": only([None], "time-limited saves", "set null"),
    "checkpointing.model_save_format": no_effect(
        "checkpoints hold torch tensors; examples/export_hf.py writes safetensors"
    ),
    "checkpointing.save_consolidated": no_effect("examples/export_hf.py writes a consolidated HF model"),
    "checkpointing.save_optimizer": only([True], "weights-only checkpoints", "set true (resume needs the optimizer)"),
    "cluster.master_port_range_*": no_effect("Ray / torch.distributed choose ports"),
    "cluster.segment_size": no_effect("NVLink topology alignment"),
}
