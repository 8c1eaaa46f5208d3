"""Schema: every example config validates; errors name key path, value and allowed values; cross-field rules."""

import pytest
from omegaconf import OmegaConf

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.schema import MasterConfig, validate_config


@pytest.fixture(scope="module")
def base_dict(base_yaml) -> dict:
    data = OmegaConf.to_container(load_config(base_yaml))
    data["cluster"]["backend"] = "local"  # null = from the device count (one device: local)
    return data


def check(base_yaml, *overrides: str) -> MasterConfig:
    return validate_config(load_config(base_yaml, overrides))


def error_of(base_yaml, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        check(base_yaml, *overrides)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_grpo_base_validates_and_round_trips(base_yaml, base_dict):
    master = validate_config(load_config(base_yaml))
    assert isinstance(master, MasterConfig)
    assert master.policy.fp8_cfg.block_size == 128
    assert master.policy.generation.kv_cache_calibration.margin == 1.05
    assert master.env.arithmetic.correct_reward == 1.0
    plain = master.model_dump()
    assert plain["policy"]["optimizer"]["betas"] == (0.9, 0.999)
    plain["policy"]["optimizer"]["betas"] = list(plain["policy"]["optimizer"]["betas"])
    # matched_kernels: null (the default) resolves to auto or false (policy/auto_switches.py, matched_by_default)
    assert base_dict["policy"]["generation"]["matched_kernels"] is None
    assert plain["policy"]["generation"].pop("matched_kernels") in ("auto", False)
    # prev_logprobs_source: auto resolves at validation; grpo_base runs one optimizer step per GRPO step
    assert base_dict["policy"]["prev_logprobs_source"] == "auto"
    assert plain["policy"].pop("prev_logprobs_source") == "train_forward"
    policy = {k: v for k, v in base_dict["policy"].items() if k != "prev_logprobs_source"}
    assert plain == {**base_dict, "policy": {**policy, "generation": {
        k: v for k, v in base_dict["policy"]["generation"].items() if k != "matched_kernels"}}}  # fmt: skip
    assert validate_config(base_dict) == master  # plain dicts are accepted too


def test_every_example_config_validates(repo_root):
    paths = sorted((repo_root / "examples" / "configs").rglob("*.yaml"))
    assert paths, "no example configs found"
    for path in paths:
        cfg = load_config(path)
        if path.parent.name == "evals":  # eval configs: a GRPO config + the `eval:` section (run_eval.py)
            from nemo_jetrl.evals.eval import EvalConfig

            EvalConfig.model_validate(OmegaConf.to_container(cfg.pop("eval")))
        validate_config(cfg)


def test_literal_error_names_key_value_and_allowed_values(base_yaml):
    message = error_of(base_yaml, "policy.generation.kv_cache_dtype=fp9")
    assert message == "policy.generation.kv_cache_dtype: 'fp9' is not one of auto, fp8"


def test_optional_literal_lists_null(base_yaml):
    message = error_of(base_yaml, "loss_fn.truncated_importance_sampling_type=foo")
    assert message == "loss_fn.truncated_importance_sampling_type: 'foo' is not one of tis, icepop, seq-mask-tis, null"


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "policy.train_micro_batch_size=0",
            "policy.train_micro_batch_size: 0 is invalid: input should be greater than 0",
        ),
        ("policy.optimizer.lr=0", "policy.optimizer.lr: 0 is invalid: input should be greater than 0"),
        (
            "policy.generation.kv_cache_calibration.percentile=100.5",
            "policy.generation.kv_cache_calibration.percentile: 100.5 is invalid: "
            "input should be less than or equal to 100",
        ),
        (
            "policy.generation.kv_cache_calibration.margin=0.99",
            "policy.generation.kv_cache_calibration.margin: 0.99 is invalid: input should be greater than or equal to 1",
        ),
        (
            "policy.fp8_cfg.num_last_layers_in_bf16=-1",
            "policy.fp8_cfg.num_last_layers_in_bf16: -1 is invalid: input should be greater than or equal to 0",
        ),
        (
            "policy.fp8_cfg.block_size=64",
            "policy.fp8_cfg.block_size: 64 is not supported; the FP8 recipe supports only 128",
        ),
        (
            "grpo.seed=abc",
            "grpo.seed: 'abc' is invalid: input should be a valid integer",
        ),
        ("policy.tokenizer=3", "policy.tokenizer: expected a mapping of keys, got 3"),
        ("policy.optimizer.lr=inf", "policy.optimizer.lr: inf is invalid: input should be a finite number"),
        (
            "loss_fn.reference_policy_kl_penalty=inf",
            "loss_fn.reference_policy_kl_penalty: inf is invalid: input should be a finite number",
        ),
        (
            "policy.generation.temperature=0",
            "policy.generation.temperature: 0 is invalid: input should be greater than or equal to 0.000001",
        ),
        (
            "env.arithmetic.correct_reward=nan",
            "env.arithmetic.correct_reward: nan is invalid: input should be a finite number",
        ),
        ("grpo.max_num_steps=true", "grpo.max_num_steps: true is invalid: input should be a valid integer"),
        (
            "policy.train_micro_batch_size=2.0",
            "policy.train_micro_batch_size: 2.0 is invalid: input should be a valid integer",
        ),
        (
            "policy.optimizer.lr=true",
            "policy.optimizer.lr: expected a number, got a boolean",
        ),
        ("+policy.optimzer.lr=1", "policy.optimzer: unknown key; did you mean 'policy.optimizer'?"),
        ("policy.optimizer.betas=[0.9,1.0]", "policy.optimizer.betas[1]: 1.0 is invalid: input should be less than 1"),
        ("loss_fn.ratio_clip_c=1.0", "loss_fn.ratio_clip_c: 1.0 is invalid: input should be greater than 1"),
    ],
)
def test_field_errors(base_yaml, override, expected):
    assert error_of(base_yaml, override) == expected


def test_unknown_key_without_close_match_lists_allowed_keys(base_yaml):
    message = error_of(base_yaml, "+logger.mlflow.zzz=1")
    assert message == "logger.mlflow.zzz: unknown key; allowed keys: experiment_name, tracking_uri"


def test_several_errors_become_one_line(base_yaml):
    message = error_of(base_yaml, "policy.precision=fp9", "grpo.max_val_samples=0")
    assert message == "policy.precision: 'fp9' is not supported here (one of bfloat16, float32, bf16, fp8)"
    message = error_of(base_yaml, "policy.master_dtype=fp9", "grpo.max_val_samples=0")
    assert message.startswith("2 config errors: ")
    assert "grpo.max_val_samples: 0 is invalid" in message
    assert "policy.master_dtype: 'fp9' is not one of float32, bfloat16" in message


# ---- cross-field rules ---------------------------------------------------------------------------------------


def test_kv_fp8_requires_fp8_rollout(base_yaml):
    assert check(base_yaml, "policy.generation.kv_cache_dtype=fp8").policy.generation.kv_cache_dtype == "fp8"
    message = error_of(base_yaml, "policy.generation.kv_cache_dtype=fp8", "policy.generation.precision=bf16")
    assert message == "policy.generation.kv_cache_dtype: 'fp8' requires policy.generation.precision: fp8 (got 'bf16')"


def test_train_kv_fake_quant_requires_kv_fp8(base_yaml):
    message = error_of(base_yaml, "policy.fp8_cfg.train_kv_fake_quant=true")
    assert message == (
        "policy.fp8_cfg.train_kv_fake_quant: true requires policy.generation.kv_cache_dtype: fp8 (got 'auto')"
    )
    check(base_yaml, "policy.fp8_cfg.train_kv_fake_quant=true", "policy.generation.kv_cache_dtype=fp8")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["policy.precision=bf16", "policy.generation.precision=fp8"], "needs one precision for trainer and rollout"),
        (["policy.generation.kv_cache_dtype=fp8"], "needs policy.fp8_cfg.train_kv_fake_quant: true"),
        (["policy.train_causal_attention=true"], "set policy.train_causal_attention: false"),
        (["policy.fused_train_kernels=false"], "set policy.fused_train_kernels: true"),
    ],
)
def test_exact_mode_refuses_what_it_cannot_honour(base_yaml, overrides, expected):
    message = error_of(base_yaml, "policy.generation.deterministic=true", *overrides)
    assert message.startswith("policy.generation.deterministic: true") and expected in message
    kv = ["policy.generation.kv_cache_dtype=fp8", "policy.fp8_cfg.train_kv_fake_quant=true"]
    assert check(base_yaml, "policy.generation.deterministic=true", *kv).policy.generation.deterministic
    packed = check(base_yaml, "policy.generation.deterministic=true", "policy.sequence_packing.enabled=true")
    assert packed.policy.sequence_packing.enabled  # packed rows run the batch-invariant kernel's varlen form


def test_sequence_packing_refuses_dynamic_batching_and_unseeded_or_unknown_algorithms(base_yaml):
    cfg = check(base_yaml, "policy.sequence_packing.enabled=true", "policy.sequence_packing.algorithm=concatenative")
    assert cfg.policy.sequence_packing.algorithm == "concatenative"
    message = error_of(base_yaml, "policy.sequence_packing.enabled=true", "policy.dynamic_batching.enabled=true")
    assert message == (
        "policy.sequence_packing.enabled and policy.dynamic_batching.enabled exclude each other (as in NeMo-RL): "
        "set one of them false"
    )
    message = error_of(base_yaml, "policy.sequence_packing.algorithm=first_fit_shuffle")
    assert message.startswith("policy.sequence_packing.algorithm: 'first_fit_shuffle' is not supported here")
    assert "is not one of" in error_of(base_yaml, "policy.sequence_packing.algorithm=best_fit")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["policy.train_causal_attention=true"], "set policy.train_causal_attention: false"),
        (["policy.fused_train_kernels=false"], "set policy.fused_train_kernels: true"),
        (["policy.generation.deterministic=true"], "set policy.generation.matched_kernels: false"),
    ],
)
def test_matched_kernels_refuse_what_they_cannot_honour(base_yaml, overrides, expected):
    message = error_of(base_yaml, "policy.generation.matched_kernels=true", *overrides)
    assert message.startswith("policy.generation.") and expected in message
    assert check(base_yaml, "policy.generation.matched_kernels=true").policy.generation.matched_kernels is True
    packed = check(base_yaml, "policy.generation.matched_kernels=true", "policy.sequence_packing.enabled=true")
    assert packed.policy.sequence_packing.enabled and packed.policy.train_cuda_graphs == "auto"
    message = error_of(base_yaml, "policy.generation.matched_kernels=true", "policy.generation.backend=vllm")
    assert "policy.generation.matched_kernels: true is the native engine's path" in message


@pytest.mark.parametrize("mode", ["deterministic", "matched_kernels"])
def test_exact_and_matched_modes_take_a_kv_budget(base_yaml, mode):
    budget = ("policy.generation.max_num_seqs=4", "policy.generation.kv_cache_memory_bytes=1000000")
    generation = check(base_yaml, f"policy.generation.{mode}=true", *budget).policy.generation
    assert getattr(generation, mode) and (generation.max_num_seqs, generation.kv_cache_memory_bytes) == (4, 10**6)
    message = error_of(base_yaml, f"policy.generation.{mode}=true", "policy.generation.backend=vllm", budget[0])
    assert message.startswith(f"policy.generation.{mode}: true is the native engine's path")


def test_kv_block_size_is_the_native_engines(base_yaml):
    assert check(base_yaml, "policy.generation.kv_block_size=32").policy.generation.kv_block_size == 32
    message = error_of(base_yaml, "policy.generation.backend=vllm", "policy.generation.kv_block_size=32")
    assert message.startswith("policy.generation.kv_block_size") and "set 16 or backend=native" in message


def test_samples_must_split_into_whole_global_batches(base_yaml):
    assert check(base_yaml, "policy.train_global_batch_size=128").policy.train_global_batch_size == 128
    message = error_of(base_yaml, "policy.train_global_batch_size=96", "policy.train_micro_batch_size=32")
    assert message == (
        "grpo.num_prompts_per_step * grpo.num_generations_per_prompt (32 * 8 = 256) must be divisible by "
        "policy.train_global_batch_size (96)"
    )
    assert "must be divisible" in error_of(base_yaml, "policy.train_global_batch_size=512")


def test_global_batch_must_be_divisible_by_micro_batch(base_yaml):
    message = error_of(base_yaml, "policy.train_micro_batch_size=48")
    assert message == "policy.train_global_batch_size (256) must be divisible by policy.train_micro_batch_size (48)"
    assert (
        check(
            base_yaml, "grpo.num_prompts_per_step=4", "policy.train_micro_batch_size=8"
        ).policy.train_global_batch_size
        == 32
        == 4 * 8
    )


def test_new_tokens_may_reach_but_not_exceed_the_total(base_yaml):
    message = error_of(base_yaml, "policy.generation.max_new_tokens=33")
    assert message == "policy.generation.max_new_tokens (33) must be <= policy.max_total_sequence_length (32)"
    assert check(base_yaml, "policy.generation.max_new_tokens=32").policy.generation.max_new_tokens == 32


def test_truncated_is_requires_correction_and_ratio(base_yaml):
    prefix = "loss_fn.truncated_importance_sampling"
    assert error_of(base_yaml, f"{prefix}_type=tis") == (
        f"{prefix}_type: 'tis' requires loss_fn.use_importance_sampling_correction: true"
    )
    assert error_of(base_yaml, f"{prefix}_type=icepop", "loss_fn.use_importance_sampling_correction=true") == (
        f"{prefix}_type: 'icepop' requires {prefix}_ratio (the upper bound, e.g. 2.0)"
    )


@pytest.mark.parametrize("kind, ratio_min", [("tis", 0.0), ("icepop", 0.5), ("seq-mask-tis", 0.5)])
def test_truncated_is_ratio_min_defaults(base_yaml, kind, ratio_min):
    loss = check(
        base_yaml,
        "loss_fn.use_importance_sampling_correction=true",
        f"loss_fn.truncated_importance_sampling_type={kind}",
        "loss_fn.truncated_importance_sampling_ratio=2.0",
    ).loss_fn
    assert loss.truncated_importance_sampling_ratio_min == ratio_min


def test_truncated_is_ratio_min_must_be_below_ratio(base_yaml):
    common = ("loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=icepop")
    message = error_of(
        base_yaml,
        *common,
        "loss_fn.truncated_importance_sampling_ratio=2",
        "loss_fn.truncated_importance_sampling_ratio_min=2",
    )
    assert (
        message
        == "loss_fn.truncated_importance_sampling_ratio_min (2) must be < loss_fn.truncated_importance_sampling_ratio (2)"
    )
    message = error_of(base_yaml, *common, "loss_fn.truncated_importance_sampling_ratio=0.8")
    assert message == (
        "loss_fn.truncated_importance_sampling_ratio_min (default 1.25) must be < "
        "loss_fn.truncated_importance_sampling_ratio (0.8)"
    )


def test_env_sections_are_typed(base_dict):
    data = {**base_dict, "env": {"arithmetic": {"correct_reward": "high", "wrong_reward": 0.0}}}
    with pytest.raises(ConfigError, match=r"^env\.arithmetic\.correct_reward: 'high' is invalid"):
        validate_config(data)
    with pytest.raises(ConfigError, match=r"^env\.mathh: unknown key"):
        validate_config({**base_dict, "env": {"mathh": {}}})


def test_non_mapping_config_is_refused():
    with pytest.raises(ConfigError, match="config must be a mapping"):
        validate_config(OmegaConf.create([1, 2]))
    with pytest.raises(ConfigError, match="config must be a mapping"):
        validate_config(3)


TP2 = "policy.dtensor_cfg.tensor_parallel_size=2"


def test_tensor_parallel_size_runs_on_ray_workers_it_divides(base_yaml):
    cfg = check(base_yaml, TP2, "cluster.backend=ray", "cluster.cpu_workers_per_node=4")
    assert cfg.policy.dtensor_cfg.tensor_parallel_size == 2 and cfg.cluster.backend == "ray"
    from nemo_jetrl.distributed import ClusterSpec

    spec = ClusterSpec.from_config(cfg.cluster, cfg.policy.dtensor_cfg.tensor_parallel_size)
    assert (spec.num_workers, spec.num_dp_groups, spec.num_seed_shards) == (4, 2, 2)  # seed shards: one per DP group
    assert check(base_yaml, "policy.dtensor_cfg.tensor_parallel_size=1").cluster.backend == "local"


def test_tensor_parallel_with_the_local_backend_is_refused_by_name(base_yaml):
    for backend in ("cluster.backend=local", "cluster.backend=null"):  # null: one device resolves to local
        assert error_of(base_yaml, TP2, backend) == (
            "policy.dtensor_cfg.tensor_parallel_size: 2 needs several ranks (each tensor-parallel rank is a torchrun "
            "rank or a Ray worker), got cluster.backend: 'local'; launch with torchrun, or set cluster.backend: ray"
        )


def test_tensor_parallel_size_must_divide_the_workers(base_yaml):
    message = error_of(base_yaml, TP2, "cluster.backend=ray", "cluster.cpu_workers_per_node=3")
    assert message == (
        "policy.dtensor_cfg.tensor_parallel_size: 2 must divide the Ray workers "
        "(cluster.num_nodes * cluster.cpu_workers_per_node = 1 * 3 = 3)"
    )
    message = error_of(base_yaml, "policy.dtensor_cfg.tensor_parallel_size=4", "cluster.gpus_per_node=2")
    assert message == (
        "policy.dtensor_cfg.tensor_parallel_size: 4 must divide the Ray workers "
        "(cluster.num_nodes * cluster.gpus_per_node = 1 * 2 = 2)"
    )
    assert error_of(base_yaml, "policy.dtensor_cfg.tensor_parallel_size=0") == (
        "policy.dtensor_cfg.tensor_parallel_size: 0 is invalid: input should be greater than 0"
    )


def test_rollout_tensor_parallel_size_follows_the_trainers_with_a_line(base_yaml):
    """NeMo-RL's vLLM TP: the native rollout runs colocated on the trainer's TP ranks, so it follows dtensor TP;
    another value runs on the trainer's layout and says so in one start-up line."""
    ray = ("cluster.backend=ray", "cluster.cpu_workers_per_node=2")
    cfg = check(base_yaml, TP2, *ray, "++policy.generation.vllm_cfg.tensor_parallel_size=2")
    assert cfg.policy.dtensor_cfg.tensor_parallel_size == 2 and cfg.startup_notes == ()
    assert check(base_yaml, "++policy.generation.vllm_cfg.tensor_parallel_size=1").startup_notes == ()
    line = (
        "policy.generation.vllm_cfg.tensor_parallel_size: {} -> {} (policy.dtensor_cfg.tensor_parallel_size): the "
        "rollout runs on the trainer's layout (its DTensor TP groups): same samples, another speed"
    )
    cfg = check(base_yaml, *ray, "++policy.generation.vllm_cfg.tensor_parallel_size=2")
    assert cfg.policy.dtensor_cfg.tensor_parallel_size == 1 and cfg.startup_notes == (line.format(2, 1),)
    cfg = check(base_yaml, TP2, *ray, "++policy.generation.vllm_cfg.tensor_parallel_size=1")
    assert cfg.policy.dtensor_cfg.tensor_parallel_size == 2 and cfg.startup_notes == (line.format(1, 2),)


def test_sequence_parallel_runs_without_it_and_says_so(base_yaml):
    cfg = check(base_yaml, "++policy.dtensor_cfg.sequence_parallel=true")
    assert cfg.startup_notes == (
        "policy.dtensor_cfg.sequence_parallel: true: TP activations stay replicated here (sequence parallelism "
        "shards them: memory only, same numbers)",
    )


@pytest.mark.parametrize(
    "blocker",
    [
        "policy.generation.deterministic=true",
        "policy.generation.backend=vllm",
        "policy.train_causal_attention=true",
        "policy.fused_train_kernels=false",
        "policy.fp8_cfg.fp8_recipe=rowwise",
        "cluster.backend=ray",
    ],
)
def test_auto_switches_refuse_nothing_a_true_would_be_refused_for(base_yaml, blocker):
    """`auto` resolves to off at start-up where `true` is refused (policy/auto_switches.py): validation passes."""
    auto = ("policy.generation.matched_kernels=auto", "policy.train_cuda_graphs=auto")
    cfg = check(base_yaml, *auto, blocker)
    assert cfg.policy.generation.matched_kernels == "auto" and cfg.policy.train_cuda_graphs == "auto"
    assert check(base_yaml).policy.train_cuda_graphs == "auto"  # the default
    assert check(base_yaml).policy.generation.matched_kernels is False  # opt-in: one line in the recipe
    message = error_of(base_yaml, "policy.train_cuda_graphs=sometimes")
    assert message.startswith("policy.train_cuda_graphs:") and "auto" in message


def test_train_cuda_graphs_refuse_the_exact_mode_and_take_sequence_packing(base_yaml):
    assert check(base_yaml, "policy.train_cuda_graphs=true").policy.train_cuda_graphs
    kv = ["policy.generation.kv_cache_dtype=fp8", "policy.fp8_cfg.train_kv_fake_quant=true"]
    assert check(base_yaml, "policy.train_cuda_graphs=true", *kv).policy.fp8_cfg.train_kv_fake_quant
    packed = check(base_yaml, "policy.train_cuda_graphs=true", "policy.sequence_packing.enabled=true")
    assert packed.policy.train_cuda_graphs and packed.policy.sequence_packing.enabled
    message = error_of(base_yaml, "policy.train_cuda_graphs=true", "policy.generation.deterministic=true")
    assert "policy.train_cuda_graphs: true" in message and "the exact mode's trainer runs eagerly" in message
