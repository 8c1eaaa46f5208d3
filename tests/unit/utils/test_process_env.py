"""policy.dtensor_cfg.env_vars (NeMo-RL's key; megatron_cfg.env_vars maps onto it): the trainer's environment. Set in
the process with one start-up line; the allocator takes PYTORCH_CUDA_ALLOC_CONF at once where CUDA has started;
activation checkpointing derives expandable segments unless the user chose; YAML scalars become strings;
megatron_cfg's variables land on the same key."""

import os
from types import SimpleNamespace

import pytest
import torch

from nemo_jetrl.config import ConfigError
from nemo_jetrl.schema import validate_config
from nemo_jetrl.schema.nemo_rl_megatron import map_megatron
from nemo_jetrl.utils import process_env

NAME = "JETRL_TEST_ENV_VAR"


@pytest.fixture
def clean_env(monkeypatch):
    """NAME and PYTORCH_CUDA_ALLOC_CONF restored after the test, whatever apply_trainer_env sets."""
    for key in (NAME, process_env.ALLOC_CONF):
        monkeypatch.setenv(key, "placeholder")  # recorded: the original state comes back at teardown
        monkeypatch.delenv(key)
    return monkeypatch


def dtensor(env_vars=None, checkpointing=False):
    return SimpleNamespace(env_vars=env_vars, activation_checkpointing=checkpointing)


def test_variables_are_set_with_one_line_and_only_when_they_change(clean_env):
    clean_env.setattr(torch.cuda, "is_initialized", lambda: False)  # a CPU box: nothing to tell the allocator
    assert process_env.apply_trainer_env(dtensor()) == [] and process_env.apply_trainer_env(dtensor({})) == []
    lines = process_env.apply_trainer_env(dtensor({NAME: "1"}))
    assert lines == [f"policy.dtensor_cfg.env_vars: the trainer runs with {NAME}=1"] and os.environ[NAME] == "1"
    assert process_env.apply_trainer_env(dtensor({NAME: "1"})) == []  # already so (a torchrun rank, the API after the CLI)
    assert process_env.ALLOC_CONF not in os.environ  # nothing derived without activation checkpointing


def test_checkpointing_derives_expandable_segments_unless_the_user_chose(clean_env):
    clean_env.setattr(torch.cuda, "is_initialized", lambda: False)
    lines = process_env.apply_trainer_env(dtensor({NAME: "2"}, checkpointing=True))
    assert lines == [
        f"policy.dtensor_cfg.env_vars: the trainer runs with {NAME}=2",
        "derived PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (activation checkpointing: long passes fragment the "
        "allocator's blocks); set policy.dtensor_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF to choose",
    ]
    assert os.environ[process_env.ALLOC_CONF] == "expandable_segments:True"
    # Ray workers get the driver's setting, whoever made it
    assert process_env.trainer_env(dtensor(checkpointing=True)) == ({process_env.ALLOC_CONF: "expandable_segments:True"}, False)
    clean_env.setenv(process_env.ALLOC_CONF, "max_split_size_mb:512")  # exported by the user: kept, no line
    assert process_env.apply_trainer_env(dtensor(checkpointing=True)) == []
    assert os.environ[process_env.ALLOC_CONF] == "max_split_size_mb:512"
    chosen = dtensor({process_env.ALLOC_CONF: "expandable_segments:False"}, checkpointing=True)  # in the config: wins
    assert process_env.apply_trainer_env(chosen) == [
        "policy.dtensor_cfg.env_vars: the trainer runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
    ]


def test_a_started_allocator_takes_the_new_settings(clean_env):
    calls = []
    clean_env.setattr(torch.cuda, "is_available", lambda: True)
    clean_env.setattr(torch.cuda, "is_initialized", lambda: True)
    clean_env.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    process_env.apply_trainer_env(dtensor({NAME: "x"}))
    assert calls == []  # other variables are only the environment's
    process_env.apply_trainer_env(dtensor({process_env.ALLOC_CONF: "expandable_segments:True"}))
    assert calls == ["expandable_segments:True"]
    assert os.environ[process_env.ALLOC_CONF] == "expandable_segments:True"


def _policy(**dtensor) -> dict:
    return {"policy": {"model_name": "tiny-arith", "dtensor_cfg": dtensor}}


def test_yaml_scalars_become_strings_and_nested_values_are_refused():
    cfg = validate_config(_policy(env_vars={"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": 1, "FLAG": True, "A": "b"}))
    assert cfg.policy.dtensor_cfg.env_vars == {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1", "FLAG": "true", "A": "b"}
    assert validate_config(_policy()).policy.dtensor_cfg.env_vars is None
    with pytest.raises(ConfigError, match=r"policy.dtensor_cfg.env_vars.X: an environment variable takes one value"):
        validate_config(_policy(env_vars={"X": {"nested": 1}}))


def test_megatron_env_vars_map_onto_the_trainers_only_when_megatron_is_enabled():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    tree = {"policy": {"megatron_cfg": {"enabled": True, "env_vars": env}}}
    mapped, _, errors = map_megatron(tree)
    assert errors == [] and mapped["policy"]["dtensor_cfg"]["env_vars"] == env
    assert "env_vars" not in mapped["policy"]["megatron_cfg"]
    off, _, _ = map_megatron({"policy": {"megatron_cfg": {"enabled": False, "env_vars": env}}})
    assert "dtensor_cfg" not in off["policy"]  # NeMo-RL reads megatron_cfg only when it is enabled
