"""The rest of what NeMo-RL's current dense configs use: each mapping resolves as NeMo-RL means it, or runs with one
start-up line saying what runs instead (config/nemo_rl_values.py, the announced lines of the key table)."""

from pathlib import Path

import pytest

from nemo_jetrl.config import load_config
from nemo_jetrl.config.errors import ConfigError
from nemo_jetrl.data.prompts import PromptFormatter
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.schema import MasterConfig, validate_config

LIKE_1B = Path(__file__).resolve().parent / "nemo_rl_yaml" / "grpo_math_1B_like.yaml"
NATIVE = "policy.generation.backend=native"


def resolved(*overrides: str) -> MasterConfig:
    return validate_config(load_config(LIKE_1B, overrides))


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["grpo.async_grpo.enabled=true"], "grpo.async_grpo.enabled: true: runs synchronously and on-policy here"),
        (["policy.generation.vllm_cfg.async_engine=true"], "vllm_cfg.async_engine: true: the rollout runs synchr"),
        (["policy.generation.colocated.enabled=false"], "colocated.enabled: false: generation runs colocated on"),
        (["data_plane.enabled=true"], "data_plane.enabled: true: NeMo-RL's TransferQueue data plane moves tensors"),
        (["policy.draft.enabled=true"], "policy.draft.enabled: true: speculative decoding (an Eagle draft) changes"),
        (["++policy.dtensor_cfg.context_parallel_size=2"], "context_parallel_size: 2: context parallelism is not"),
        (["policy.generation.backend=sglang"], "policy.generation.backend: 'sglang' -> native (nemo-jetrl's rollout"),
        (["policy.generation.top_p=0.9"], "policy.generation.backend: 'vllm' -> native: with top_p < 1 / top_k"),
        (["++policy.generation.vllm_cfg.is_mx=true"], "vllm_cfg.is_mx: true: MXFP8 (E8M0 scales per 1x32) needs"),
    ],
)
def test_what_runs_differently_is_accepted_with_one_start_up_line(overrides, line):
    cfg = resolved(*overrides)
    assert len(cfg.startup_notes) == 1 and line in cfg.startup_notes[0], cfg.startup_notes
    assert cfg.ignored_key_warnings == ()


def test_checkpoint_must_save_by_is_honoured_and_a_bad_value_refused():
    """NeMo-RL's deadline save runs here (utils/save_deadline.py): the value reaches the section without a start-up
    line; a value that is not 'DD:HH:MM:SS' is refused naming the key."""
    cfg = resolved("checkpointing.checkpoint_must_save_by='00:03:45:00'")
    assert cfg.checkpointing.checkpoint_must_save_by == "00:03:45:00"
    assert cfg.startup_notes == () and cfg.ignored_key_warnings == ()
    assert resolved().checkpointing.checkpoint_must_save_by is None  # the file's null
    with pytest.raises(ConfigError, match=r"checkpoint_must_save_by must be 'DD:HH:MM:SS'.*'3:45:00'"):
        resolved("checkpointing.checkpoint_must_save_by='3:45:00'")


def test_other_rollout_engines_run_on_the_native_one():
    assert resolved("policy.generation.backend=trtllm").policy.generation.backend == "native"
    top_p = resolved("policy.generation.top_p=0.9").policy.generation
    assert (top_p.backend, top_p.top_p) == ("native", 0.9)
    assert resolved().policy.generation.backend == "vllm" and resolved().startup_notes == ()


def test_transformer_engine_fused_adam_is_adamw_with_fp32_moments():
    cfg = resolved(
        "policy.optimizer.name=transformer_engine.pytorch.optimizers.fused_adam.FusedAdam",
        "++policy.optimizer.kwargs.master_weights=true",
        "++policy.optimizer.kwargs.exp_avg_dtype=torch.bfloat16",
    )
    assert cfg.policy.optimizer.name == "adamw" and cfg.policy.optimizer.lr == 5.0e-6
    assert [n.split(":")[0] for n in cfg.startup_notes] == ["policy.optimizer.name", "policy.optimizer.kwargs.exp_avg_dtype"]


def test_new_nemo_rl_semantics_keys_are_honoured():
    cfg = resolved(
        "grpo.val_at_end=true",
        "grpo.reward_scaling.enabled=true",
        "grpo.reward_scaling.target_min=-1.0",
        "loss_fn.force_on_policy_ratio=true",
        "env.math.math_verify_impl=dapo_math_verify",
        "policy.tokenizer.chat_template_kwargs={enable_thinking: false}",
        "policy.hf_config_overrides={max_position_embeddings: 4096}",
        "++policy.tokenizer.chat_template=null",
    )
    assert cfg.grpo.val_at_end and cfg.grpo.reward_scaling.target_min == -1.0 and cfg.loss_fn.force_on_policy_ratio
    assert cfg.env.math.math_verify_impl == "dapo_math_verify"
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False} and cfg.data.use_chat_template is False
    assert cfg.policy.hf_config_overrides == {"max_position_embeddings": 4096}


def test_data_default_fills_train_and_validation_their_own_keys_winning(tmp_path):
    (tmp_path / "p.txt").write_text("Q: {}")
    cfg = resolved(
        f"data.default.prompt_file={tmp_path}/p.txt",
        "++data.default.input_key=question",
        "++data.default.dataset_name=/d/default.jsonl",
        "data.train={dataset_name: /d/train.jsonl}",
        "data.validation={dataset_name: /d/val.jsonl}",
    )
    # each dataset's own name wins over the default's; the default's prompt file and key reach both
    assert (cfg.data.dataset_name, cfg.data.val_dataset_name) == ("/d/train.jsonl", "/d/val.jsonl")
    assert cfg.data.prompt_template == "Q: {}" and cfg.data.input_key == "question"


class _ChatTokenizer:
    """A tokenizer stand-in whose chat template shows the kwargs it got."""

    chat_template = "stand-in"
    bos_token = None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        return f"{messages[-1]['content']}|thinking={kwargs.get('enable_thinking', 'default')}"


def test_chat_template_kwargs_reach_apply_chat_template():
    plain = PromptFormatter(_ChatTokenizer()).render("2+2")
    qwen3 = PromptFormatter(_ChatTokenizer(), chat_template_kwargs={"enable_thinking": False}).render("2+2")
    assert (plain, qwen3) == ("2+2|thinking=default", "2+2|thinking=False")


def test_hf_config_overrides_replace_config_values_at_load():
    model, _ = load_model_and_tokenizer("tiny-arith", config_overrides={"max_position_embeddings": 77})
    assert model.config.max_position_embeddings == 77
