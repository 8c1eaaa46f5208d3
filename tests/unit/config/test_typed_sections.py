"""The validated config stays typed from validation to the end of a run: every component that takes a config
section refuses its plain dict with one TypeError naming the type it expects (`config.typed.typed_section`), and
the one place a config crosses into a Ray worker dumps it to plain data and validates it back unchanged."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.config.typed import typed_section
from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.worker import worker_sections, worker_setup_payload
from nemo_jetrl.environments import make_task
from nemo_jetrl.generation.build import build_local_engine
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.policy.memory_estimate import TrainerMemorySettings
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.policy.trainer_setup import build_optimizer
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.logger import Logger

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cfg():
    return validate_config(load_config(CONFIG, ["cluster.rollout_seed_shards=3", "policy.optimizer.lr=2e-4"]))


def test_typed_section_passes_the_type_and_its_subclasses_and_names_it_for_anything_else(cfg):
    class Derived(PolicyConfig):
        pass

    derived = Derived()
    assert typed_section(cfg.policy, "PolicyConfig", "x") is cfg.policy
    assert typed_section(derived, "PolicyConfig", "x") is derived
    with pytest.raises(TypeError) as err:
        typed_section(cfg.policy.model_dump(), "PolicyConfig", "NativePolicy")
    assert str(err.value) == (
        "NativePolicy expects the validated config section PolicyConfig, got dict: build it with "
        "PolicyConfig.model_validate(...) (or take it from the validated MasterConfig)"
    )
    with pytest.raises(TypeError, match="expects the validated config section PolicyConfig, got ClusterConfig"):
        typed_section(cfg.cluster, "PolicyConfig", "x")  # another section is refused too


def _refusals(cfg):
    """(what is called, the type its message names): each gets the section's dict where it takes the section."""
    dumped = cfg.model_dump()
    policy = dumped["policy"]
    return [
        (lambda: NativePolicy(policy, PrecisionRecipe.preset("jetrl"), CPU), "NativePolicy", "PolicyConfig"),
        (lambda: PrecisionRecipe.from_config(policy), "PrecisionRecipe.from_config", "PolicyConfig"),
        (lambda: ClusterSpec.from_config(dumped["cluster"]), "ClusterSpec.from_config", "ClusterConfig"),
        (lambda: build_optimizer([], policy["optimizer"]), "build_optimizer", "OptimizerConfig"),
        (lambda: TrainerMemorySettings.from_policy(policy), "TrainerMemorySettings.from_policy", "PolicyConfig"),
        (lambda: build_local_engine(policy["generation"], None, None, CPU, max_total_length=8, seed=0),
         "build_local_engine", "GenerationConfig"),  # fmt: skip
        (lambda: Logger(dumped["logger"]), "Logger", "LoggerConfig"),
        (lambda: ClippedPGLossFn(dumped["loss_fn"]), "ClippedPGLossFn", "LossConfig"),
        (lambda: make_task(dumped["data"], cfg.env), "make_task", "DataConfig"),
        (lambda: grpo.setup(dumped), "grpo.setup", "MasterConfig"),
        (lambda: grpo.run_grpo(dumped), "run_grpo", "MasterConfig"),
    ]


def test_every_component_refuses_its_sections_dict_naming_the_type(cfg):
    called = []
    for call, where, expected in _refusals(cfg):
        with pytest.raises(TypeError) as err:
            call()
        assert str(err.value).startswith(f"{where} expects the validated config section {expected}, got dict: ")
        called.append(where)
    assert len(called) == 11


def test_the_ray_worker_payload_is_plain_data_and_validates_back_to_the_same_sections(cfg):
    spec = ClusterSpec.from_config(cfg.cluster, tensor_parallel_size=1)
    payload = worker_setup_payload(cfg.policy, spec, cfg.grpo.seed)

    def plain(value) -> bool:  # no section object crosses: only builtins (and the tuples pydantic dumps)
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return all(plain(v) for v in value)
        return value is None or type(value) in (str, int, float, bool)

    assert plain(payload) and set(payload) == {"policy", "spec", "seed"}
    policy, spec_back, seed = worker_sections(pickle.loads(pickle.dumps(payload)))  # as Ray's object store moves it
    assert type(policy) is PolicyConfig and policy == cfg.policy and policy is not cfg.policy
    assert policy.optimizer.lr == 2e-4 and policy.generation.precision == "fp8"  # overrides and filled defaults kept
    assert spec_back == spec and spec_back.num_seed_shards == 3 and seed == cfg.grpo.seed == 42
