"""Keys NeMo-RL defines (nemo_rl_defined_keys.txt, written by tools/nemo_rl_snapshot.py): every one has a field or a
table line; a newer key under a NeMo-RL-only section warns and runs; a typo in one of our keys stays an error with
the near key; the snapshot and compatibility tools work on a small tree written here."""

import textwrap
from pathlib import Path

import pytest
from jetrl_testkit.cli import load_script, run_main

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.config.nemo_rl_facts import defined_keys, is_nemo_rl_mapping, pinned_commit
from nemo_jetrl.config.nemo_rl_keys import KEY_RULES
from nemo_jetrl.config.nemo_rl_rules import IGNORED
from nemo_jetrl.schema import validate_config
from nemo_jetrl.schema.nemo_rl import lookup, nemo_rl_only

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent / "nemo_rl_yaml"
LIKE_1B = HERE / "grpo_math_1B_like.yaml"
MEGATRON_FP8 = HERE / "grpo_megatron_fp8.yaml"
PINNED = "7ea279abfbeb698b092856d0dab61e7cf39bc909"


def _under_whole_rule(key: str) -> bool:
    """Keys inside a mapping one table line takes whole (e.g. chat_template_kwargs) are never looked up."""
    return any(key.startswith(p + ".") for p, rule in KEY_RULES.items() if rule.whole)


def test_every_key_nemo_rl_defines_has_a_field_or_a_table_line():
    keys, opens = defined_keys()
    assert pinned_commit() == PINNED and len(keys) > 1000
    leaves = [k for k in keys if not is_nemo_rl_mapping(k) and not _under_whole_rule(k)]
    uncovered = [k for k in leaves if lookup(k, 1) is IGNORED]
    uncovered += [f"{p}.*" for p in opens if not _under_whole_rule(p + ".x") and lookup(p + ".x", 1) is IGNORED]
    assert uncovered == []  # give each a line in config/nemo_rl_keys.py / nemo_rl_policy_keys.py (or a field)
    assert "policy.sequence_packing.microbatch_order" in keys and lookup(
        "policy.sequence_packing.microbatch_order", "largest_first"
    ) is KEY_RULES["policy.sequence_packing.microbatch_order"]


def test_nemo_rl_only_sections_are_nemo_rls_mappings_outside_our_schema():
    only = nemo_rl_only()
    for section in ("policy.megatron_cfg", "policy.generation.vllm_cfg", "policy.generation.vllm_kwargs",
                    "policy.generation.sglang_cfg", "policy.generation.trtllm_cfg", "data_plane", "grpo.async_grpo",
                    "policy.draft"):  # fmt: skip
        assert section in only, section
    assert not {"policy", "policy.optimizer", "policy.generation", "grpo", "env.math"} & set(only)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (MEGATRON_FP8, "policy.megatron_cfg.brand_new_knob"),  # read by NeMo-RL only with megatron_cfg.enabled
        (MEGATRON_FP8, "policy.megatron_cfg.optimizer.new_adam_flag"),
        (LIKE_1B, "policy.generation.vllm_cfg.new_engine_flag"),
        (LIKE_1B, "data_plane.new_transport"),
        (LIKE_1B, "grpo.async_grpo.new_staleness"),
        (LIKE_1B, "brand_new_section.enabled"),  # a top-level section newer than the list
    ],
)
def test_a_key_newer_than_the_table_warns_once_and_runs(config, key):
    cfg = validate_config(load_config(config, [f"++{key}=3"]))
    assert cfg.ignored_key_warnings == (f"{key}: not known to this version of nemo-jetrl: ignored",)
    assert cfg.model_dump() == validate_config(load_config(config)).model_dump()


def test_the_warning_is_one_stderr_line_and_the_run_goes_on():
    main = load_script(ROOT / "examples" / "run_grpo.py", "run_grpo_coverage").main
    args = ["--config", str(MEGATRON_FP8), "--validate-only", "++policy.megatron_cfg.brand_new_knob=3"]
    rc, out, err = run_main(main, args)
    assert rc == 0 and "precision: train=fp8" in out
    assert err == "warning: policy.megatron_cfg.brand_new_knob: not known to this version of nemo-jetrl: ignored\n"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("++policy.optimizer.lrr=1e-3", "policy.optimizer.lrr: unknown key; did you mean 'policy.optimizer.lr'?"),
        ("++grpo.val_periodd=3", "grpo.val_periodd: unknown key; did you mean 'grpo.val_period'?"),
        ("++policy.optimzer.lr=1e-3", "policy.optimzer: unknown key; did you mean 'policy.optimizer'?"),
        ("++env.math.corect_reward=2", "env.math.corect_reward: unknown key; did you mean 'env.math.correct_reward'?"),
        ("++polcy.model_name=x", "polcy: unknown key; did you mean 'policy'?"),
    ],
)
def test_a_typo_in_one_of_our_keys_is_still_an_error_with_the_near_key(override, expected):
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(LIKE_1B, [override]))
    assert str(err.value) == expected


def test_snapshot_tool_reads_typed_dicts_models_and_example_keys(tmp_path):
    pkg = tmp_path / "nemo_rl"
    (pkg / "algorithms").mkdir(parents=True)
    (pkg / "models").mkdir()
    (pkg / "models" / "config.py").write_text(textwrap.dedent('''
        from typing import Any, NotRequired, TypedDict
        class GenerationConfig(TypedDict):
            backend: str
        class VllmConfig(GenerationConfig):
            vllm_cfg: "VllmArgs"
            vllm_kwargs: NotRequired[dict[str, Any]]
        class VllmArgs(TypedDict):
            precision: str
        class PolicyConfig(TypedDict):
            model_name: str
            generation: NotRequired[GenerationConfig | None]
            scheduler: list[dict[str, Any]] | None
    '''))  # fmt: skip
    (pkg / "algorithms" / "grpo.py").write_text(textwrap.dedent('''
        from pydantic import BaseModel
        from nemo_rl.models.config import PolicyConfig
        class GRPOConfig(BaseModel, extra="allow"):
            model_config = None
            max_num_steps: int = 1
        class MasterConfig(BaseModel):
            policy: PolicyConfig
            grpo: GRPOConfig
    '''))  # fmt: skip
    (tmp_path / "examples" / "configs").mkdir(parents=True)
    (tmp_path / "examples" / "configs" / "grpo_x.yaml").write_text("defaults: a.yaml\ngrpo: {yaml_only: 1}\n")
    (tmp_path / "examples" / "configs" / "sft.yaml").write_text("sft: {ignored: 1}\n")
    tool = load_script(ROOT / "tools" / "nemo_rl_snapshot.py", "nemo_rl_snapshot_tool")
    keys = sorted(set(tool.defined_keys(tmp_path)) | tool.example_keys(tmp_path))
    assert keys == [
        "grpo", "grpo.max_num_steps", "grpo.yaml_only", "policy", "policy.generation", "policy.generation.backend",
        "policy.generation.vllm_cfg", "policy.generation.vllm_cfg.precision", "policy.generation.vllm_kwargs",
        "policy.generation.vllm_kwargs.*", "policy.model_name", "policy.scheduler",
    ]  # fmt: skip


def test_compat_tool_tables_a_small_tree(tmp_path):
    configs = tmp_path / "examples" / "configs"
    configs.mkdir(parents=True)
    (configs / "grpo_dense.yaml").write_text(
        "policy: {model_name: tiny-arith, megatron_cfg: {enabled: true, optimizer: {lr: 1.0e-6}}}\n"
    )
    (configs / "grpo_moe.yaml").write_text("policy: {model_name: Qwen/Qwen3-30B-A3B, dtensor_cfg: {lora_cfg: "
                                           "{enabled: true}}}\n")  # fmt: skip
    (configs / "grpo_moe_ep.yaml").write_text("policy: {model_name: Qwen/Qwen3-30B-A3B, megatron_cfg: {enabled: true, "
                                              "expert_model_parallel_size: 4}}\n")  # fmt: skip
    (configs / "grpo_other_moe.yaml").write_text("policy: {model_name: moonshotai/Moonlight-16B-A3B}\n")
    tool = load_script(ROOT / "tools" / "nemo_rl_compat.py", "nemo_rl_compat_tree")
    outcomes = tool.validate_tree(tmp_path)
    assert [(o.path, o.family, o.ok) for o in outcomes] == [
        ("examples/configs/grpo_dense.yaml", "dense", True),
        ("examples/configs/grpo_moe.yaml", "Qwen3-MoE", False),
        ("examples/configs/grpo_moe_ep.yaml", "Qwen3-MoE", False),
        ("examples/configs/grpo_other_moe.yaml", "MoE", True),
    ]
    assert outcomes[1].ep1 is None and outcomes[2].ep1.startswith("validates: precision: train=fp8")
    table = tool.render_tree_table(outcomes, PINNED)
    assert "**1 of 1 validate (100.0%)**; all configs: 2 of 4. Qwen3-MoE configs (docs/moe.md): 1 of 2 validate" in table
    row = next(line for line in table.splitlines() if line.startswith("| `grpo_moe_ep.yaml`"))
    assert row.startswith(
        "| `grpo_moe_ep.yaml` | Qwen3-MoE | refused: policy.megatron_cfg.expert_model_parallel_size: 4 is not supported "
        "here (expert parallelism (MoE)); set 1 (not built yet"
    )
    assert "; with expert parallelism 1: validates: train=fp8 rollout=fp8" in row
    assert "| `grpo_moe.yaml` | Qwen3-MoE | refused: policy.dtensor_cfg.lora_cfg.enabled: true is not supported" in table
