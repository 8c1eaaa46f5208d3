"""policy.dtensor_cfg.env_vars (NeMo-RL's key; megatron_cfg.env_vars maps onto it): the trainer's environment. Set in
the process with one start-up line; the allocator takes PYTORCH_CUDA_ALLOC_CONF at once where CUDA has started;
YAML scalars become strings; megatron_cfg's variables land on the same key."""

import os

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


def test_variables_are_set_with_one_line_and_only_when_they_change(clean_env):
    clean_env.setattr(torch.cuda, "is_initialized", lambda: False)  # a CPU box: nothing to tell the allocator
    assert process_env.apply_trainer_env(None) == [] and process_env.apply_trainer_env({}) == []
    lines = process_env.apply_trainer_env({NAME: "1"})
    assert lines == [f"policy.dtensor_cfg.env_vars: the trainer runs with {NAME}=1"] and os.environ[NAME] == "1"
    assert process_env.apply_trainer_env({NAME: "1"}) == []  # already so (a torchrun rank, the API after the CLI)


def test_a_started_allocator_takes_the_new_settings(clean_env):
    calls = []
    clean_env.setattr(torch.cuda, "is_available", lambda: True)
    clean_env.setattr(torch.cuda, "is_initialized", lambda: True)
    clean_env.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    process_env.apply_trainer_env({NAME: "x"})
    assert calls == []  # other variables are only the environment's
    process_env.apply_trainer_env({process_env.ALLOC_CONF: "expandable_segments:True"})
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
