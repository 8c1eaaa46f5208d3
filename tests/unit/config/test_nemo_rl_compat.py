"""NeMo-RL's config tree as input: honoured keys change the resolved config as NeMo-RL would, refused keys give one
line naming key and value (exit 2), re-expressed shipped recipes resolve to identical effective configs."""

from pathlib import Path

import pytest
from jetrl_testkit.cli import load_script, run_main

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.config.nemo_rl_keys import KEY_RULES
from nemo_jetrl.precision.config import precision_line
from nemo_jetrl.schema import MasterConfig, validate_config
from nemo_jetrl.schema.nemo_rl import is_schema_field, rule_for

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent / "nemo_rl_yaml"
CONFIGS = ROOT / "examples" / "configs"
LIKE_1B = HERE / "grpo_math_1B_like.yaml"


def resolved(*overrides: str, config: Path = LIKE_1B) -> MasterConfig:
    return validate_config(load_config(config, overrides))


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        resolved(*overrides)
    return str(err.value)


@pytest.mark.parametrize(
    ("ours", "nemo_rl"),
    [
        ("grpo_tiny.yaml", "grpo_tiny.yaml"),
        ("grpo_tiny_bf16.yaml", "grpo_tiny_bf16.yaml"),
        ("grpo_tiny_fp8_rollout_only.yaml", "grpo_tiny_fp8_rollout_only.yaml"),
        ("grpo_math_8B_fp8_kv.yaml", "grpo_math_8B_fp8_kv.yaml"),
        ("grpo_math_8B_fp8.yaml", "grpo_math_8B_fp8.yaml"),
        ("grpo_math_8B_bf16.yaml", "grpo_math_8B_bf16.yaml"),
    ],
)
def test_shipped_recipes_in_nemo_rl_spelling_resolve_identically(ours, nemo_rl):
    """Their `policy.generation.backend: vllm` stays vllm (our recipes default to the native engine)."""
    theirs = resolved(config=HERE / nemo_rl)
    assert theirs.policy.generation.backend == "vllm"
    assert theirs.model_dump() == resolved("policy.generation.backend=vllm", config=CONFIGS / ours).model_dump()


def test_grpo_base_yaml_equals_the_types_defaults():
    assert resolved(config=CONFIGS / "grpo_base.yaml").model_dump() == validate_config({}).model_dump()


def test_full_nemo_rl_config_maps_its_fp8_and_optimizer_keys():
    cfg = resolved()
    assert (cfg.policy.precision, cfg.policy.compute_dtype, cfg.policy.generation.precision) == (
        "fp8",
        "bfloat16",
        "fp8",
    )
    assert cfg.policy.generation.kv_cache_dtype == "fp8"  # fp8_e4m3
    assert (cfg.policy.fp8_cfg.num_first_layers_in_bf16, cfg.policy.fp8_cfg.num_last_layers_in_bf16) == (1, 1)
    assert cfg.policy.optimizer.model_dump() == {
        "name": "adamw",
        "lr": 5.0e-6,
        "weight_decay": 0.01,
        "betas": (0.9, 0.999),
        "eps": 1.0e-8,
        "decay_1d_params": True,
        "allow_large_lr": False,
    }
    assert cfg.policy.generation.backend == "vllm" and cfg.policy.generation.cuda_graphs is True
    assert cfg.policy.generation.max_new_tokens == cfg.policy.max_total_sequence_length == 16
    assert cfg.policy.logprob_batch_size == 4 and cfg.policy.train_global_batch_size == 16
    assert cfg.grpo.val_period == -1 and cfg.loss_fn.truncated_importance_sampling_ratio_min == 0.0
    assert precision_line(cfg.policy) == (
        "precision: train=fp8 rollout=fp8 kv=fp8 bf16_first=1 bf16_last=1 "
        "recipe=blockwise-e4m3(w128x128,a1x128,wgrad_x=1x128)"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [
                "policy.precision=float32",
                "policy.megatron_cfg.fp8_cfg.enabled=false",
                "policy.generation.vllm_cfg.precision=bfloat16",
                "policy.generation.vllm_cfg.kv_cache_dtype=auto",
            ],
            {"policy.precision": "bf16", "policy.compute_dtype": "float32", "policy.generation.precision": "bf16"},
        ),
        (
            ["policy.megatron_cfg.fp8_cfg.enabled=false", "policy.generation.vllm_cfg.kv_cache_dtype=auto"],
            {"policy.precision": "bf16", "policy.generation.precision": "fp8"},
        ),  # FP8 rollout only
        (["policy.generation.vllm_cfg.enforce_eager=true"], {"policy.generation.cuda_graphs": False}),
        ([], {"policy.fp8_cfg.use_deep_gemm": True}),  # the 1B-like file sets vllm_cfg.use_deep_gemm: true
        (["policy.generation.vllm_cfg.use_deep_gemm=false"], {"policy.fp8_cfg.use_deep_gemm": False}),
        (
            ["policy.generation.vllm_cfg.pow2_weight_scaling_factors=true"],
            {"policy.fp8_cfg.pow2_weight_scaling_factors": True},
        ),
        (
            ["policy.optimizer.name=torch.optim.Adam", "policy.optimizer.kwargs.lr=2e-5"],
            {"policy.optimizer.name": "adam", "policy.optimizer.lr": 2e-5},
        ),
        (
            ["policy.train_global_batch_size=8", "policy.train_micro_batch_size=4"],
            {"policy.train_global_batch_size": 8},
        ),
        (
            ["data.train.dataset_name=/d/train.jsonl", "data.validation={dataset_name: /d/val.jsonl}"],
            {"data.dataset_name": "/d/train.jsonl", "data.val_dataset_name": "/d/val.jsonl"},
        ),
        (["cluster.gpus_per_node=8"], {"cluster.backend": "ray"}),
        (
            ["policy.sequence_packing.algorithm=first_fit_decreasing", "+policy.sequence_packing.train_mb_tokens=48"],
            {"policy.sequence_packing.enabled": True, "policy.sequence_packing.train_mb_tokens": 48},
        ),  # NeMo-RL's default (enabled, MFFD) is in the 1B-like file: honoured, no longer accepted without effect
        (
            ["+policy.generation.vllm_kwargs.block_size=32", "policy.generation.backend=native"],
            {"policy.generation.kv_block_size": 32},
        ),
        (
            ["policy.megatron_cfg.fp8_cfg.fp8_recipe=tensorwise", "policy.generation.backend=native"],
            {"policy.fp8_cfg.fp8_recipe": "tensorwise"},
        ),
        (
            ["policy.megatron_cfg.fp8_cfg.fp8_recipe=rowwise", "policy.generation.backend=native"],
            {"policy.fp8_cfg.fp8_recipe": "rowwise"},
        ),
    ],
)
def test_honoured_keys_change_the_resolved_config(overrides, expected):
    cfg = resolved(*overrides)
    for key, value in expected.items():
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        assert node == value, key


def test_prompt_file_is_read_into_the_template(tmp_path):
    (tmp_path / "cot.txt").write_text("Think. {}")
    assert resolved(f"data.default.prompt_file={tmp_path}/cot.txt").data.prompt_template == "Think. {}"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["policy.generation.precision=bf16"],
            "policy.generation.vllm_cfg.precision: 'fp8' disagrees with policy.generation.precision: 'bf16'",
        ),
        (["+policy.optimizer.lr=1e-3"], "policy.optimizer.kwargs.lr: 5e-06 disagrees with policy.optimizer.lr: 0.001"),
        (
            ["policy.compute_dtype=float32"],
            "policy.precision: 'bfloat16' disagrees with policy.compute_dtype: 'float32'",
        ),
    ],
)
def test_both_spellings_must_agree(overrides, expected):
    with pytest.raises(ConfigError) as err:
        resolved(*["++" + o.lstrip("+") for o in overrides])
    assert expected in str(err.value)


REFUSED = {
    "expert": (
        "++policy.dtensor_cfg.expert_parallel_size=2",
        "policy.dtensor_cfg.expert_parallel_size: 2 is not supported here (expert parallelism (MoE)); set 1 (not built",
    ),
    "lora": ("policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.enabled: true is not supported"),
    "cispo": ("loss_fn.use_cispo=true", "loss_fn.use_cispo: true is not supported here (CISPO)"),
    "multi_turn": ("grpo.max_rollout_turns=4", "grpo.max_rollout_turns: 4 is not supported here (multi-turn"),
    "env_var": ("policy.model_name=${oc.env:JETRL_UNSET_VAR}", "environment variable JETRL_UNSET_VAR is not set"),
    "mxfp8": ("policy.megatron_cfg.fp8_cfg.fp8_recipe=mxfp8", "fp8_recipe: 'mxfp8' is not supported here (MXFP8"),
    "hybrid": ("policy.megatron_cfg.fp8_cfg.fp8=hybrid", "policy.megatron_cfg.fp8_cfg.fp8: 'hybrid' is not supported"),
    "e5m2_kv": ("policy.generation.vllm_cfg.kv_cache_dtype=fp8_e5m2", "kv_cache_dtype: 'fp8_e5m2' is not supported"),
    "float16": ("policy.precision=float16", "policy.precision: 'float16' is not supported here"),
    "sgd": ("policy.optimizer.name=torch.optim.SGD", "policy.optimizer.name: 'torch.optim.SGD' is not supported"),
    "local_8_gpus": ("+cluster.backend=local", None),
    "inf_kl": ("loss_fn.reference_policy_kl_penalty=inf", "loss_fn.reference_policy_kl_penalty: inf is invalid"),
}


@pytest.mark.parametrize(
    ("recipe", "line"),
    [("rowwise", "recipe=rowwise-e4m3(w_per_row,a_per_row)"), ("tensorwise", "recipe=tensorwise-e4m3(w_per_tensor")],
)
def test_precision_line_names_the_recipe(recipe, line):
    cfg = resolved(f"policy.megatron_cfg.fp8_cfg.fp8_recipe={recipe}", "policy.generation.backend=native")
    assert line in precision_line(cfg.policy)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "fp8_recipe: rowwise with policy.generation.backend: vllm is not supported"),
        (
            [
                "policy.generation.backend=native",
                "++policy.generation.deterministic=true",
                "~policy.generation.vllm_cfg.gpu_memory_utilization",
                "++policy.fp8_cfg.train_kv_fake_quant=true",
                "++policy.sequence_packing.enabled=false",
            ],
            "fp8_recipe: rowwise with policy.generation.deterministic: true is not supported",
        ),
        (
            [
                "policy.generation.backend=native",
                "++policy.generation.matched_kernels=true",
                "~policy.generation.vllm_cfg.gpu_memory_utilization",
                "++policy.sequence_packing.enabled=false",
            ],
            "fp8_recipe: rowwise with policy.generation.matched_kernels: true is not supported",
        ),
        (
            ["policy.generation.backend=native", "cluster.gpus_per_node=8"],
            "fp8_recipe: rowwise with cluster.backend: ray is not supported",
        ),
    ],
)
def test_non_blockwise_recipes_are_refused_by_name_where_not_built(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        resolved("policy.megatron_cfg.fp8_cfg.fp8_recipe=rowwise", *overrides)


def test_neutral_values_of_refusable_keys_are_accepted():
    cfg = resolved("policy.megatron_cfg.pipeline_model_parallel_size=1", "grpo.async_grpo.enabled=false")
    assert cfg.cluster.backend == "local"


@pytest.fixture(scope="module")
def cli_refusals() -> dict[str, tuple[int, str, str]]:
    """run_grpo.py's main() in this process per refused key: name -> (status, stdout, stderr) (test_run_grpo_cli.py
    shows the script as a fresh process gives what its main() gives in-process)."""
    main = load_script(ROOT / "examples" / "run_grpo.py", "run_grpo_script").main
    results = {}
    for name, (override, _) in REFUSED.items():
        extra = ["cluster.gpus_per_node=8"] if name == "local_8_gpus" else []
        results[name] = run_main(main, ["--config", str(LIKE_1B), "--validate-only", override, *extra])
    return results


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_keys_give_one_line_and_exit_2(cli_refusals, case):
    rc, out, err = cli_refusals[case]
    expected = REFUSED[case][1] or "cluster.backend: 'local' is one process on one device"
    assert rc == 2 and out == "" and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and expected in err, err


def test_override_marker_replaces_the_inherited_mapping(tmp_path):
    (tmp_path / "parent.yaml").write_text(
        "env:\n  math:\n    format_reward: 0.5\npolicy:\n  optimizer:\n    eps: 1.0e-6\n"
    )
    (tmp_path / "child.yaml").write_text(
        "defaults: parent.yaml\nenv:\n  math:\n    _override_: true\n    correct_reward: 3.0\n"
        "policy:\n  optimizer:\n    _override_: false\n    lr: 1.0e-3\n"
    )
    cfg = validate_config(load_config(tmp_path / "child.yaml"))
    assert cfg.env.math.correct_reward == 3.0 and cfg.env.math.format_reward == 0.0  # replaced: type default
    assert cfg.policy.optimizer.lr == 1e-3 and cfg.policy.optimizer.eps == 1e-6  # merged


def test_no_table_line_shadows_a_schema_field():
    shadowed = [p for p in KEY_RULES if "*" not in p and is_schema_field(p) and KEY_RULES[p].kind != "honoured"]
    assert shadowed == []  # a key the schema honours must not also be documented as no-effect / refused
    assert rule_for("policy.megatron_cfg.moe_router_dtype").kind == "no_effect"
    assert rule_for("policy.megatron_cfg.pipeline_model_parallel_size").kind == "megatron"
    assert rule_for("policy.megatron_cfg.expert_model_parallel_size").kind == "refused"


def test_docs_table_lists_every_key_rule():
    docs = (ROOT / "docs" / "nemo_rl.md").read_text()
    missing = [
        f"{key}: {rule.docs}"
        for key, rule in KEY_RULES.items()
        if f"| `{key}` | {rule.docs.replace('|', '/')} |" not in docs
    ]
    assert missing == []  # regenerate: python tools/nemo_rl_compat.py keys
    tool = load_script(ROOT / "tools" / "nemo_rl_compat.py", "nemo_rl_compat_tool")
    assert tool.render_key_table() in docs


@pytest.mark.parametrize(
    ("config", "limit"),
    [(CONFIGS / "grpo_tiny.yaml", 12), (CONFIGS / "grpo_math_8B_fp8.yaml", 512), (LIKE_1B, 11)],
)
def test_prompt_limit_of_shipped_and_nemo_rl_configs(config, limit):
    from nemo_jetrl.generation.interfaces import max_prompt_length

    cfg = resolved(config=config)
    total = cfg.policy.max_total_sequence_length
    assert max_prompt_length(total, cfg.policy.generation.max_new_tokens, cfg.data.max_input_seq_length) == limit
    assert max_prompt_length(total, total, None) == total - 1  # max_new_tokens = the total: NeMo-RL's spelling
