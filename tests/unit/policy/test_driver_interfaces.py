"""The GRPO driver talks to trainers and engines only through `PolicyInterface` / `GenerationInterface`, and both
trainers (one process, Ray) carry every member the interface declares; the loss is handed to `train`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nemo_jetrl.algorithms.loss import ClippedPGLossFn, clipped_pg_loss
from nemo_jetrl.config import load_config
from nemo_jetrl.distributed.ray_policy import RayPolicy
from nemo_jetrl.generation.interfaces import GenerationInterface
from nemo_jetrl.policy.interfaces import PolicyInterface, TrainBatch
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "examples" / "configs" / "grpo_tiny.yaml"
DRIVER_FILES = [
    REPO / "nemo_jetrl" / "algorithms" / name for name in ("grpo.py", "grpo_checkpoint.py", "preflight.py")
] + [REPO / "nemo_jetrl" / "evals" / "eval.py"]


def _members(interface: type) -> set[str]:
    """Methods, properties and declared attributes of an interface (its own and its bases', object's excluded)."""
    names = set()
    for klass in interface.__mro__[:-1]:
        names |= {n for n in vars(klass) if not n.startswith("_")} | set(getattr(klass, "__annotations__", {}))
    return names


def _used_members(path: Path, handle: str) -> set[str]:
    """Attributes read from `run.<handle>` / `<handle>` (the driver's local name) in one source file; the config's
    section of the same name (`run.cfg.policy`, `cfg.policy`) is not the handle."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        target = node.value
        via_run = isinstance(target, ast.Attribute) and target.attr == handle and not _is_config(target.value)
        direct = isinstance(target, ast.Name) and target.id == handle
        if via_run or direct:
            used.add(node.attr)
    return used


def _is_config(node: ast.expr) -> bool:
    """`cfg` or `<...>.cfg`: the validated config, whose sections are named as the run's handles."""
    return (isinstance(node, ast.Name) and node.id == "cfg") or (isinstance(node, ast.Attribute) and node.attr == "cfg")


@pytest.mark.parametrize(("handle", "interface"), [("policy", PolicyInterface), ("engine", GenerationInterface)])
def test_driver_uses_only_what_the_interface_declares(handle, interface):
    used = set().union(*(_used_members(p, handle) for p in DRIVER_FILES))
    assert used, f"no run.{handle} member found: the scan is broken"
    assert used - _members(interface) == set(), f"run.{handle} members the interface does not declare"


def test_driver_reads_no_member_with_getattr():
    for path in DRIVER_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
                target = ast.unparse(node.args[0])
                assert not target.endswith(("policy", "engine")), f"{path.name}: getattr({target}, ...)"


def test_trainers_import_no_loss():
    for module in ("policy/native.py", "policy/trainer_core.py", "distributed/ray_policy.py"):
        source = (REPO / "nemo_jetrl" / module).read_text()
        assert "algorithms" not in source, f"{module} imports from algorithms/"


@pytest.fixture(scope="module")
def cfg():
    return validate_config(load_config(CONFIG, ["loss_fn.reference_policy_kl_penalty=0.1"]))


def _declared_attributes() -> list[str]:
    return list(PolicyInterface.__annotations__)


def test_native_policy_holds_every_declared_attribute(cfg):
    policy = NativePolicy(cfg.policy, PrecisionRecipe.from_config(cfg.policy), torch.device("cpu"))
    for name in _declared_attributes():
        assert hasattr(policy, name), name
    assert policy.recipe.kv_fp8 and policy.kv_scales is None and policy.step == 0
    assert not policy.has_reference  # the reference follows the constructor argument, not the loss config
    expected = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    assert policy.parameter_bytes() == expected > 0


def test_ray_policy_holds_every_declared_attribute(cfg):
    group = SimpleNamespace(num_workers=2)  # the driver-side handle only; no worker is started
    info = {"tokenizer": object(), "layer_map": {"model.layers.0.mlp.up_proj": "fp8"}, "parameter_bytes": 1234}
    policy = RayPolicy(group, cfg.policy, info, init_reference_model=True)
    for name in _declared_attributes():
        assert hasattr(policy, name), name
    assert policy.has_reference and policy.parameter_bytes() == 1234 and policy.kv_scales is None
    assert inspect.signature(policy.train).parameters.keys() == {"batch", "loss_fn"}


@pytest.mark.parametrize("token_level", [True, False])
def test_clipped_pg_loss_fn_is_the_loss_with_the_global_normalizer(cfg, token_level):
    loss_cfg = cfg.loss_fn.model_copy(update={"token_level_loss": token_level, "reference_policy_kl_penalty": 0.0})
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 0], [0, 0, 0, 0]])
    logp = -torch.rand(3, 4, generator=gen)
    batch = TrainBatch(torch.zeros(3, 4, dtype=torch.long), torch.ones(3, 4), mask, torch.tensor([1.0, -0.5, 2.0]),
                       logp - 0.01, prev_logprobs=logp + 0.02)  # fmt: skip
    loss_fn = ClippedPGLossFn(loss_cfg)
    assert loss_fn.normalizer(batch) == (4.0 if token_level else 2.0)  # tokens, or sequences with a token
    loss, metrics = loss_fn(logp, batch, 10.0)
    ref, ref_metrics = clipped_pg_loss(
        logp, batch.prev_logprobs, batch.generation_logprobs, batch.advantages, mask, loss_cfg, normalizer=10.0
    )
    assert torch.equal(loss, ref) and metrics == ref_metrics
    empty = batch.select(slice(2, 3))
    assert loss_fn.normalizer(empty) == 1.0  # no token: never a division by zero


def test_metrics_to_floats_reads_tensors_and_floats_in_order():
    from nemo_jetrl.policy.interfaces import metrics_to_floats

    metrics = [
        {"a": torch.tensor(1.5), "b": 2, "c": torch.tensor([3], dtype=torch.long)},
        {"a": torch.tensor(float("inf")), "d": torch.tensor(True)},
    ]
    assert metrics_to_floats(metrics) == [{"a": 1.5, "b": 2.0, "c": 3.0}, {"a": float("inf"), "d": 1.0}]
    assert metrics_to_floats([{"x": 0.25}]) == [{"x": 0.25}] and metrics_to_floats([]) == []
