"""The `policy.*` lines of the NeMo-RL key table (config/nemo_rl_keys.py explains the kinds and the order)."""

from __future__ import annotations

from nemo_jetrl.config.nemo_rl_rules import Rule, alias, announced, megatron, no_effect, only, same_as

DENSE = "Automodel's MoE sharding options: MoE experts are not sharded here (Qwen3-MoE runs every expert on each device)"
MEMORY = "memory / speed tuning of an engine this implementation does not use"
VLLM = "vLLM engine setting the adapter (generation/vllm_engine.py) sets itself or leaves at vLLM's default"
DATA_PLANE = "NeMo-RL's data plane / transport; one process or Ray workers exchange tensors directly here"
BOTH_SIDES = "one layer map: these layers stay BF16 on trainer AND rollout (NeMo-RL: rollout only)"
KV_FRACTION = "the fraction of the GPU memory the colocated trainer leaves free (its state stays resident)"
MULTIMODAL = "image / audio / video inputs: text-only prompts here"
MOE = "set 1 (not built yet: Qwen3-MoE runs all its experts on one device, cluster.backend: local)"
ROUTER_FP32 = "the MoE routers' logits and softmax run in FP32 on trainer and rollout here (models/moe.py)"
ONE_TRAINER = (
    "use cluster.num_nodes / gpus_per_node (data-parallel FSDP2 workers) and policy.dtensor_cfg.tensor_parallel_size"
)
CONTEXT_PARALLEL = (
    "context parallelism is not built here: its ranks join data parallelism and each rank holds whole sequences "
    "(activation memory only, same numbers)"
)
TRAINER_LAYOUT = "the rollout runs on the trainer's layout (its DTensor TP groups): same samples, another speed"
OTHER_ENGINE = "a setting of another rollout engine: the native engine runs instead (policy.generation.backend)"
MEGATRON_TUNING = (
    "Megatron-only tuning (fusions, CUDA graphs, offloading, checkpoint I/O, loss scaling, MoE options): the FSDP2 "
    "trainer's numbers do not depend on it"
)

POLICY_RULES: dict[str, Rule] = {
    "policy.tokenizer.chat_template": alias(
        "data.use_chat_template",
        {"default": True, None: False},
        reason="default: the tokenizer's own template; null: NeMo-RL's passthrough (the prompt text as is)",
    ),
    "policy.tokenizer.chat_template_kwargs": alias(
        "data.chat_template_kwargs", whole=True, reason="passed to apply_chat_template (Qwen3: enable_thinking)"
    ),
    "policy.tokenizer.use_fastokens": no_effect("tokenizer speed only"),
    "policy.tokenizer.use_processor": only([False, None], "multimodal processors", "remove it"),
    "policy.tokenizer.audio*": no_effect(MULTIMODAL),
    "policy.tokenizer.video*": no_effect(MULTIMODAL),
    "policy.is_vlm": only([False, None], "vision-language models", "use a text-only causal LM"),
    "policy.generation_batch_size": no_effect("NeMo-RL's HF generation backend only"),
    "policy.logprob_chunk_size": no_effect(MEMORY),
    "policy.offload_optimizer_for_logprob": no_effect(MEMORY),
    "policy.refit_buffer_size_gb": no_effect(DATA_PLANE),
    "policy.make_sequence_length_divisible_by": no_effect("padding only; the trainer masks padded tokens"),
    "policy.activation_checkpointing_enabled": alias("policy.dtensor_cfg.activation_checkpointing"),
    "policy.quant_cfg": only([None], "ModelOpt quantization-aware training", "set null (FP8 comes from the recipe)"),
    "policy.quant_*": no_effect("read only with policy.quant_cfg"),
    "policy.disable_modelopt_layer_spec": no_effect("read only with policy.quant_cfg"),
    "policy.pretrained_checkpoint*": only([None], "starting from a Megatron checkpoint", "use policy.model_name"),
    "policy.reward_model_cfg.enabled": only([False, None], "reward-model training", "set false"),
    "policy.reward_model_cfg.*": no_effect("read only with reward_model_cfg.enabled: true"),
    "policy.router_replay.enabled": only(
        [False, None], "MoE router replay", "set false: the rollout and the trainer route alike here (the exact mode and "
        "matched_kernels: the same experts bit for bit; train/routing_agreement measures it on every path)"
    ),
    "policy.sequence_packing.microbatch_order": no_effect("the order packed micro-batches run in (memory reuse)"),
    "policy.sequence_packing.fuse_loss": no_effect("Megatron's fused packed-loss kernel (same loss)"),
    "policy.optimizer.kwargs.lr": alias("policy.optimizer.lr"),
    "policy.optimizer.kwargs.weight_decay": alias("policy.optimizer.weight_decay"),
    "policy.optimizer.kwargs.betas": alias("policy.optimizer.betas"),
    "policy.optimizer.kwargs.eps": alias("policy.optimizer.eps"),
    "policy.optimizer.kwargs.foreach": no_effect("implementation choice of torch's AdamW (same update)"),
    "policy.optimizer.kwargs.fused": no_effect("implementation choice of torch's AdamW (same update)"),
    "policy.optimizer.kwargs.amsgrad": only([False], "AMSGrad", "set false"),
    "policy.optimizer.kwargs.master_weights": only(
        [True], "TransformerEngine FusedAdam without FP32 master weights", "set true (FP32 master, as here)"
    ),
    "policy.optimizer.kwargs.exp_avg_dtype": announced(
        [None, "torch.float32"], "Adam moments stay FP32 here (a BF16 store only saves memory, at some precision)"
    ),
    "policy.optimizer.kwargs.exp_avg_sq_dtype": announced(
        [None, "torch.float32"], "Adam moments stay FP32 here (a BF16 store only saves memory, at some precision)"
    ),
    "policy.optimizer.kwargs.store_param_remainders": no_effect("how FusedAdam stores its FP32 master (memory)"),
    "policy.optimizer.kwargs.*": only([None], "other optimizer arguments", "remove it"),
    "policy.dtensor_cfg.enabled": no_effect("the trainer here is always FSDP2 (DTensor)"),
    "policy.dtensor_cfg._v2": no_effect("NeMo-RL's DTensor worker version"),
    "policy.dtensor_cfg.cpu_offload": no_effect(MEMORY),
    "policy.dtensor_cfg.sequence_parallel": announced(
        [False], "TP activations stay replicated here (sequence parallelism shards them: memory only, same numbers)"
    ),
    "policy.dtensor_cfg.context_parallel_size": announced([1, None], CONTEXT_PARALLEL),
    "policy.dtensor_cfg.expert_parallel_size": only([1, None], "expert parallelism (MoE)", MOE),
    "policy.dtensor_cfg.dp_replicate_size": no_effect("HSDP's replicate dimension: a sharding layout (same numbers)"),
    "policy.dtensor_cfg.defer_fsdp_grad_sync": no_effect("gradient-sync timing (same numbers)"),
    "policy.dtensor_cfg.moe_parallelizer.*": no_effect(DENSE),
    "policy.dtensor_cfg.custom_parallel_plan": only([None], "custom parallel plans", "set null"),
    "policy.dtensor_cfg.automodel_kwargs*": no_effect("NeMo Automodel loading options; models load from HF files"),
    "policy.dtensor_cfg.lora_cfg.enabled": only([False], "LoRA", "set false (full fine-tuning)"),
    "policy.dtensor_cfg.lora_cfg.*": no_effect("read only with lora_cfg.enabled: true"),
    "policy.dtensor_cfg.clear_cache_every_n_steps": no_effect(
        "the allocator's cached blocks go back to the driver after every rollout and before every training pass here"
    ),
    # megatron_cfg (schema/nemo_rl_megatron.py): with enabled: true these are mapped; the FP8 switches always
    "policy.megatron_cfg.enabled": megatron("trained by the FSDP2 trainer as the lines below say (start-up lines)"),
    "policy.megatron_cfg.tensor_model_parallel_size": megatron("-> `policy.dtensor_cfg.tensor_parallel_size`"),
    "policy.megatron_cfg.pipeline_model_parallel_size": megatron("its ranks join FSDP's data-parallel sharding"),
    "policy.megatron_cfg.sequence_parallel": megatron("TP without sequence parallelism (activation memory only)"),
    "policy.megatron_cfg.activation_checkpointing": megatron("-> `policy.dtensor_cfg.activation_checkpointing`"),
    "policy.megatron_cfg.recompute_*": megatron("per-layer activation checkpointing whatever the granularity"),
    "policy.megatron_cfg.env_vars*": megatron("-> `policy.dtensor_cfg.env_vars` (the trainer's environment)"),
    "policy.megatron_cfg.optimizer.optimizer": megatron("`adam` -> AdamW; other values refused"),
    "policy.megatron_cfg.optimizer.lr": megatron("-> `policy.optimizer.lr` and the scheduler's max_lr"),
    "policy.megatron_cfg.optimizer.min_lr": megatron("the scheduler's min_lr"),
    "policy.megatron_cfg.optimizer.weight_decay": megatron(
        "-> `policy.optimizer.weight_decay`, not on biases / norm weights (`policy.optimizer.decay_1d_params: false`)"
    ),
    "policy.megatron_cfg.optimizer.adam_beta1": megatron("-> `policy.optimizer.betas[0]`"),
    "policy.megatron_cfg.optimizer.adam_beta2": megatron("-> `policy.optimizer.betas[1]`"),
    "policy.megatron_cfg.optimizer.adam_eps": megatron("-> `policy.optimizer.eps`"),
    "policy.megatron_cfg.optimizer.clip_grad": megatron("-> `policy.max_grad_norm` (0: no clipping)"),
    "policy.megatron_cfg.optimizer.fp16": only([False], "FP16 training", "set false (BF16 / FP8 here)"),
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer": no_effect(
        "who holds the FP32 master copy (its default dtypes are FP32, as here)"
    ),
    "policy.megatron_cfg.optimizer.params_dtype": no_effect("the master copy is policy.master_dtype (float32)"),
    "policy.megatron_cfg.scheduler.lr_*": megatron(
        "megatron-core's OptimizerParamScheduler in GRPO steps -> `policy.scheduler` (policy/megatron_schedule.py)"
    ),
    "policy.megatron_cfg.scheduler.*_weight_decay": megatron("the scheduler's weight-decay ramp"),
    "policy.megatron_cfg.scheduler.weight_decay_incr_style": megatron("the scheduler's weight-decay ramp"),
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
    "policy.megatron_cfg.context_parallel_size": announced([1, None], CONTEXT_PARALLEL),
    "policy.megatron_cfg.expert_model_parallel_size": only([1], "expert parallelism (MoE)", MOE),
    "policy.megatron_cfg.expert_tensor_parallel_size": only([1, None], "expert parallelism (MoE)", MOE),
    "policy.megatron_cfg.freeze_moe_router": megatron("-> `policy.freeze_moe_router` (MoE routers not trained)"),
    "policy.megatron_cfg.moe_router_load_balancing_type": megatron(
        "`none` -> `policy.router_aux_loss_coef: 0`; `aux_loss` -> HF's load-balancing loss (coefficient "
        "`moe_aux_loss_coeff`, else the model config's router_aux_loss_coef); `seq_aux_loss` / `global_aux_loss` "
        "refused"
    ),
    "policy.megatron_cfg.moe_router_dtype": announced([None, "fp32", "fp64"], ROUTER_FP32),
    "policy.megatron_cfg.moe_router_bias_update_rate": no_effect(
        "the aux-loss-free expert bias update: Qwen3-MoE's router has no expert bias"
    ),
    "policy.megatron_cfg.moe_router_enable_expert_bias": only(
        [False, None], "a router expert bias (DeepSeek-V3's aux-loss-free balancing)", "set false (Qwen3-MoE has none)"
    ),
    "policy.megatron_cfg.moe_router_num_groups": only([None, 1], "group-limited routing", "set null (Qwen3-MoE)"),
    "policy.megatron_cfg.moe_router_group_topk": only([None, 1], "group-limited routing", "set null (Qwen3-MoE)"),
    "policy.megatron_cfg.moe_*": no_effect(
        "Megatron's MoE dispatch / kernel tuning (token dispatcher, permute fusion, grouped GEMM, DeepEP, logging): "
        "the same experts and numbers here (models/moe.py)"
    ),
    "policy.megatron_cfg.peft.enabled": only([False], "LoRA", "set false (full fine-tuning)"),
    "policy.megatron_cfg.mtp_num_layers": only([0, None], "multi-token prediction layers", "set 0"),
    "policy.megatron_cfg.model_overrides": only(
        [None, {}], "model config overrides", "edit the model's config.json", whole=True
    ),
    "policy.megatron_cfg.train_iters": no_effect("NeMo-RL sets it to grpo.max_num_steps"),
    "policy.megatron_cfg.*": no_effect(MEGATRON_TUNING),
    "policy.draft.enabled": announced(
        [False, None], "speculative decoding (an Eagle draft) changes speed, not the samples: the rollout samples "
        "the policy without a draft here, and no draft is trained"
    ),  # fmt: skip
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
    "policy.generation.vllm_cfg.is_mx": announced(
        [False, None], "MXFP8 (E8M0 scales per 1x32) needs Blackwell's tensor cores: the rollout runs the recipe's "
        "FP8 (policy.fp8_cfg.fp8_recipe, blockwise E4M3 by default) on Hopper"
    ),  # fmt: skip
    "policy.generation.vllm_cfg.quantization_ignored_layer_kws": announced(
        [None, []], "linears NeMo-RL's FP8 rollout keeps BF16 by name: not built here (the one layer map keeps whole "
        "first / last layers BF16, num_first/last_layers_in_bf16): they run the recipe's FP8 on trainer and rollout"
    ),  # fmt: skip
    "policy.generation.vllm_cfg.async_engine": announced(
        [False, None], "the rollout runs synchronously (the async engine serves async GRPO, not built here): same "
        "samples"
    ),  # fmt: skip
    "policy.generation.vllm_cfg.tensor_parallel_size": same_as(
        "policy.dtensor_cfg.tensor_parallel_size", 1, "a rollout TP other than the trainer's", TRAINER_LAYOUT,
        announce=True,
    ),  # fmt: skip
    "policy.generation.vllm_cfg.pipeline_parallel_size": announced([1, None], TRAINER_LAYOUT),
    "policy.generation.vllm_cfg.expert_parallel_size": only([1, None], "expert parallelism (MoE)", MOE),
    "policy.generation.vllm_cfg.enable_expert_parallel": only([False, None], "expert parallelism (MoE)", MOE),
    "policy.generation.vllm_cfg.enable_return_routed_experts": no_effect(
        "the native rollout records each token's experts itself (GenerationOutput.routed_experts)"
    ),
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
    "policy.generation.sglang_*": no_effect(OTHER_ENGINE),
    "policy.generation.trtllm_*": no_effect(OTHER_ENGINE),
    "policy.generation.dynamo_cfg*": no_effect(OTHER_ENGINE),
    "policy.generation.mcore_generation_config*": no_effect(OTHER_ENGINE),
    "policy.generation.use_async_rollouts": announced(
        [False, None], "the rollout runs synchronously (async rollouts serve async GRPO, not built here): same samples"
    ),
    "policy.generation.stop_strings": only([None, []], "stop strings", "use policy.generation.stop_token_ids"),
    "policy.generation.bad_words": only([None, []], "banned words", "remove it"),
    "policy.generation.val_temperature": no_effect("validation samples at policy.generation.temperature"),
    "policy.generation.val_top_p": no_effect("validation samples at policy.generation.top_p"),
    "policy.generation.val_top_k": no_effect("validation samples at policy.generation.top_k"),
    "policy.generation.colocated.enabled": announced(
        [True, None], "generation runs colocated on the training GPUs here (all cluster.num_nodes x gpus_per_node): "
        "the same synchronous GRPO on another placement"
    ),  # fmt: skip
    "policy.generation.colocated.*": no_effect("read only with colocated.enabled: false"),
    "policy.generation.port_range_*": no_effect(DATA_PLANE),
    "policy.generation.refit_*": no_effect(DATA_PLANE),
    "policy.generation.real_quant_export_cpu_offload": no_effect(DATA_PLANE),
    "policy.generation.quant_cfg": only([None], "ModelOpt rollout quantization", "set null (FP8 from the recipe)"),
    "policy.generation.real_quant": only([False, None], "ModelOpt rollout quantization", "set false"),
    "policy.generation.real_quant_ignore": no_effect("read only with policy.generation.real_quant: true"),
    "policy.generation.model_name": no_effect("NeMo-RL's GRPO writes it from policy.model_name"),
    "policy.generation._*": no_effect("NeMo-RL internal (written by its GRPO, not by users)"),
}
