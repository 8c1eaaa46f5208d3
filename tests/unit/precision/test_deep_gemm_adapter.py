"""`use_deep_gemm`: which products go to DeepGEMM, what the switch does where it cannot run (CPU), and that the
recipe, the NeMo-RL key and the trainer's layers carry it. The GPU twin: tests/gpu/test_deep_gemm_gpu.py."""

import pytest
import torch

from nemo_jetrl.precision import Fp8Linear, FpropKernel, PrecisionRecipe, deep_gemm_adapter
from nemo_jetrl.precision.gemm import _emulated_mm, fp8_blockwise_mm
from nemo_jetrl.precision.linear import fprop_backend, library_backend
from nemo_jetrl.precision.quant import act_quant, weight_quant

FP8 = torch.float8_e4m3fn


def operands(m=64, n=256, k=384, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) * 0.05
    return (*act_quant(x), *weight_quant(w))


@pytest.mark.parametrize(
    "change,fits",
    [
        ({}, True),
        ({"w_blocks": "1x128"}, False),  # WGrad's groups along the tokens stay on cuBLAS
        ({"out_dtype": torch.float32}, False),
        ({"bias": torch.zeros(256)}, False),
        ({"n": 200}, False),
        ({"transposed_x": True}, False),
    ],
)
def test_fits_takes_the_recipes_fprop_and_dgrad_products_only(change, fits):
    n = change.get("n", 256)
    xq, _, wq, _ = operands(n=256)
    wq = wq[:n]
    if change.get("transposed_x"):
        xq = xq.t().contiguous().t()
    args = dict(w_blocks="128x128", block=128, out_dtype=torch.bfloat16, bias=None)
    args.update({k: v for k, v in change.items() if k in args})
    assert deep_gemm_adapter.fits(xq, wq, **args) is fits


def test_unusable_reason_names_the_device_and_a_missing_module(monkeypatch):
    assert "CUDA sm90" in deep_gemm_adapter.unusable_reason("cpu")
    assert not deep_gemm_adapter.usable(torch.device("cpu"))
    monkeypatch.setitem(__import__("sys").modules, "deep_gemm", None)  # import deep_gemm -> ImportError
    deep_gemm_adapter._import.cache_clear()
    try:
        module, reason = deep_gemm_adapter._import()
        assert module is None and reason.startswith("deep_gemm does not import (ModuleNotFoundError")
    finally:
        deep_gemm_adapter._import.cache_clear()
    line = deep_gemm_adapter.status_line("cpu")
    assert line.startswith("use_deep_gemm: not used") and "cuBLAS / Triton" in line
    assert "rowwise" in deep_gemm_adapter.status_line("cpu", "rowwise")


def test_where_deep_gemm_cannot_run_the_switch_keeps_the_bits():
    xq, xs, wq, ws = operands()
    auto = fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16)
    requested = fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16, backend="deep_gemm")
    assert torch.equal(auto.view(torch.int16), requested.view(torch.int16))


@pytest.fixture
def fake_deep_gemm(monkeypatch):
    """DeepGEMM 'usable' on this CPU: each call is recorded ([M, N, K]) and computed by the exact emulation."""
    calls = []

    def fp8_gemm(x_fp8, x_scale, w_fp8, w_scale):
        calls.append(tuple(x_fp8.shape) + (w_fp8.shape[0],))
        return _emulated_mm(x_fp8, x_scale, w_fp8, w_scale, torch.bfloat16, None, "128x128", 128)

    monkeypatch.setattr(deep_gemm_adapter, "usable", lambda device: True)
    monkeypatch.setattr(deep_gemm_adapter, "fp8_gemm", fp8_gemm)
    return calls


@pytest.mark.parametrize("bias", [False, True])
def test_a_training_linear_sends_fprop_and_dgrad_to_deep_gemm_not_wgrad(fake_deep_gemm, bias):
    outs = {}
    for use in (False, True):
        recipe = PrecisionRecipe.preset("jetrl", use_deep_gemm=use)
        torch.manual_seed(0)
        layer = Fp8Linear(384, 256, bias=bias, recipe=recipe, dtype=torch.bfloat16)
        x = torch.randn(64, 384, dtype=torch.bfloat16, requires_grad=True)
        y = layer(x)
        y.float().square().sum().backward()
        outs[use] = (y, x.grad, layer.weight.grad)
        assert fprop_backend(layer) == ("deep_gemm" if use else "auto") == library_backend(recipe)
    # FProp [64, 256] = X [64, 384] W^T; DGrad [64, 384] = dY [64, 256] W; WGrad (1x128 along tokens) stays off
    assert fake_deep_gemm == ([] if bias else [(64, 384, 256)]) + [(64, 256, 384)]
    for a, b in zip(outs[False], outs[True]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))  # the emulation: the same bits either way


def test_rollout_mode_and_the_exact_mode_choices(fake_deep_gemm):
    recipe = PrecisionRecipe.preset("jetrl", use_deep_gemm=True)
    layer = Fp8Linear(384, 256, bias=False, recipe=recipe, dtype=torch.bfloat16)
    layer.mode = "rollout"
    layer(torch.randn(3, 384, dtype=torch.bfloat16))
    assert fake_deep_gemm == [(3, 384, 256)]
    layer.fprop_kernel = FpropKernel.BATCH_INVARIANT  # the exact mode keeps its batch-invariant GEMM
    assert fprop_backend(layer) == "batch_invariant"


def test_the_recipe_and_the_nemo_rl_key_carry_the_switch():
    from pathlib import Path

    from nemo_jetrl.config import load_config
    from nemo_jetrl.schema import validate_config

    configs = Path(__file__).resolve().parents[3] / "examples" / "configs"
    assert PrecisionRecipe().use_deep_gemm is False
    cfg = validate_config(load_config(configs / "grpo_tiny.yaml", ["policy.fp8_cfg.use_deep_gemm=true"]))
    assert PrecisionRecipe.from_config(cfg.policy).use_deep_gemm is True
    assert PrecisionRecipe.from_config(validate_config(load_config(configs / "grpo_tiny.yaml")).policy).use_deep_gemm is False
