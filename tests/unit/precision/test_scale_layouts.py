"""Scale layouts as objects (precision/recipes/): a fourth layout registered from outside runs an FP8 linear forward
and backward with nothing else changed; the GEMM choice comes from one function; the config asks the layout's
features; and no module outside precision/recipes/ compares layout names."""

import ast
import copy
import typing
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, convert_to_fp8, rollout_mode
from nemo_jetrl.precision.config import Fp8Config, recipe_problems
from nemo_jetrl.precision.quant import act_dequant, act_quant, act_quant_t
from nemo_jetrl.precision.recipes import (
    BLOCKWISE,
    FpropKernel,
    GemmChoice,
    LayoutFeatures,
    ScaleLayout,
    choose_gemm,
    layout_names,
    register_layout,
    scale_layout,
    unregister_layout,
)

ROOT = Path(__file__).resolve().parents[3]
G = 64  # the toy layout's group size


@dataclass(frozen=True)
class Groups1x64(ScaleLayout):
    """Toy layout: every GEMM operand in 1x64 groups along the dim its GEMM contracts (weights too), emulated GEMMs
    (the base class's). Built from the project's group quantizers at another group size; no feature beyond the
    three GEMMs."""

    name: str = "groups1x64"

    def weight_quant(self, w, recipe):
        q, s = act_quant(w, G, recipe.pow2_weight_scales)  # [N, K], [N, K/64]
        return q, s, (~torch.isfinite(w)).sum().to(torch.int32)

    def weight_scale_shape(self, n, k, block):
        return n, -(-k // G)

    def make_dgrad_weight(self, qweight, master, recipe):
        return act_quant_t(master.detach(), G, recipe.pow2_weight_scales)  # W^T [K, N] along N: [K, N/64]

    def input_quant(self, x2, recipe):
        return act_quant(x2, G, recipe.pow2_activation_scales)  # [M, K], [M, K/64]

    def input_quant_train(self, x2, recipe):
        return (*self.input_quant(x2, recipe), *act_quant_t(x2, G, recipe.pow2_activation_scales))  # X^T: [K, M]

    def grad_quant(self, dy2, recipe, need_dx, need_dw):
        pow2 = recipe.pow2_activation_scales
        dy = act_quant(dy2, G, pow2) if need_dx else (None, None)  # [M, N], [M, N/64]
        dyt = act_quant_t(dy2, G, pow2) if need_dw else (None, None)  # [N, M], [N, M/64]
        return (*dy, *dyt)

    def operand_dequant(self, q, scale):
        return act_dequant(q, scale, G)


@pytest.fixture
def toy():
    layout = register_layout(Groups1x64())
    yield layout
    unregister_layout(layout.name)


def ref_cast(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hand-written 1x64 cast of t [R, C] along C (C a multiple of 64): e4m3 values and their fp32 dequant."""
    groups = t.float().reshape(t.shape[0], -1, G)  # [R, C/64, 64]
    amax = groups.abs().amax(-1, keepdim=True)
    scale = amax.clamp_min(1e-10) * torch.tensor(1 / 448, dtype=torch.float32)
    q = (groups / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(t.shape), (q.float() * scale).reshape(t.shape)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_a_registered_fourth_layout_runs_an_fp8_linear_forward_and_backward(toy):
    recipe = PrecisionRecipe.preset("jetrl", granularity=toy.name)
    assert recipe.layout is toy and choose_gemm(recipe) == GemmChoice()
    torch.manual_seed(0)
    ref = nn.Linear(256, 192)
    layer = Fp8Linear.from_linear(copy.deepcopy(ref), recipe)
    x = torch.randn(128, 256, requires_grad=True)
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    w, xd = ref.weight.detach(), x.detach()
    qw = layer.quantized_weight()
    assert qw.granularity == toy.name and tuple(qw.scale.shape) == (192, 4)
    assert torch.equal(qw.data.view(torch.uint8), ref_cast(w)[0].view(torch.uint8))  # the toy cast is the hand one
    # the three GEMMs: exactly the dequantized FP8 operands multiplied in FP32
    want_y = ref_cast(xd)[1] @ ref_cast(w)[1].t() + ref.bias.detach()
    want_dx = ref_cast(dy)[1] @ ref_cast(w.t().contiguous())[1].t()  # W^T cast along N
    want_dw = ref_cast(dy.t().contiguous())[1] @ ref_cast(xd.t().contiguous())[1].t()  # both along the tokens
    assert torch.equal(y.detach(), want_y)
    assert torch.equal(x.grad, want_dx)
    assert torch.equal(layer.weight.grad, want_dw)
    assert torch.equal(layer.bias.grad, dy.sum(0))
    # and FP8 products: against FP32 the e4m3 error (measured 3.5% on all three), neither zero nor broken
    x32 = xd.clone().requires_grad_(True)
    y32 = ref(x32)
    y32.backward(dy)
    for got, want in ((y.detach(), y32.detach()), (x.grad, x32.grad), (layer.weight.grad, ref.weight.grad)):
        assert 0.01 < rel(got, want) < 0.05
    with torch.no_grad(), rollout_mode(layer):  # the rollout forward: the trainer's bits
        assert torch.equal(layer(xd), y.detach())


def test_a_fourth_layout_trains_a_converted_model_and_is_refused_where_it_has_no_feature(toy):
    recipe = PrecisionRecipe.preset("jetrl", granularity=toy.name)
    model, fp8, blockwise = random_tiny_qwen3(0), random_tiny_qwen3(0), random_tiny_qwen3(0)
    convert_to_fp8(fp8, recipe)  # q/k/v and gate/up share one FP8 buffer each: the stacked 1x64 scales
    convert_to_fp8(blockwise, PrecisionRecipe.preset("jetrl"))
    ids = torch.randint(3, 30, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, logits8 = model(ids).logits.detach(), fp8(ids).logits
    logits8.square().mean().backward()
    # the logits' FP8 error next to the Jet-RL layout's (measured 0.131 and 0.144: a random model, 0.2 init)
    err, err_blockwise = rel(logits8.detach(), logits), rel(blockwise(ids).logits.detach(), logits)
    assert 0.02 < err < 1.25 * err_blockwise
    grads = [p.grad for n, p in fp8.named_parameters() if "proj" in n]
    assert len(grads) == 14 and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    layer = fp8.model.layers[0].self_attn.o_proj
    layer.fprop_kernel = FpropKernel.BATCH_INVARIANT  # the exact mode: the toy has no batch-invariant GEMM
    with pytest.raises(ValueError, match="exact mode's FP8 GEMM is blockwise; the groups1x64 recipe has none"):
        layer(torch.randn(3, layer.in_features))
    # the config's cross-section rules ask the layout's features, by the layout's name
    gen = SimpleNamespace(precision="fp8", backend="vllm", deterministic=True, matched_kernels=False)
    policy = SimpleNamespace(precision="fp8", generation=gen, fp8_cfg=SimpleNamespace(fp8_recipe=toy.name))
    problems = recipe_problems(policy, "ray")
    assert [p.split(" with ")[1].split(":")[0] for p in problems] == [
        "policy.generation.backend",
        "policy.generation.deterministic",
        "cluster.backend",
    ]
    assert all(p.startswith("policy.fp8_cfg.fp8_recipe: groups1x64 with") for p in problems)
    assert all(p.endswith("blockwise") for p in problems)  # the layout that has the feature


def test_the_gemm_choice_is_one_function_of_the_recipe_and_the_linears_switches():
    jetrl, dg = PrecisionRecipe.preset("jetrl"), PrecisionRecipe.preset("jetrl", use_deep_gemm=True)
    rowwise_dg = PrecisionRecipe.preset("rowwise", use_deep_gemm=True)
    assert choose_gemm(jetrl) == GemmChoice("auto", "auto", "auto")
    assert choose_gemm(dg) == GemmChoice("deep_gemm", "deep_gemm", "auto")  # WGrad stays on cuBLAS
    assert choose_gemm(rowwise_dg) == GemmChoice()  # DeepGEMM takes no rowwise product
    assert choose_gemm(dg, FpropKernel.CUBLAS) == GemmChoice("scaled_mm_padded", "deep_gemm")
    assert choose_gemm(dg, FpropKernel.BATCH_INVARIANT) == GemmChoice("batch_invariant", "deep_gemm")


def test_config_literal_names_exactly_the_registered_layouts():
    # adding a layout: a module in precision/recipes/, its registration, and this one Literal
    assert typing.get_args(Fp8Config.model_fields["fp8_recipe"].annotation) == layout_names()
    assert scale_layout("blockwise") is BLOCKWISE and BLOCKWISE.features == LayoutFeatures(*[True] * 7)
    for name in layout_names():
        assert PrecisionRecipe.preset("jetrl", granularity=name).layout.name == name
    with pytest.raises(ValueError, match="unknown FP8 scale layout 'mxfp8'; registered: blockwise, rowwise"):
        scale_layout("mxfp8")
    with pytest.raises(ValueError, match="already registered"):
        register_layout(Groups1x64(name="rowwise"))


# ----------------------------------------------------------------------------------------------------------------
# no branch on a layout name outside precision/recipes/
# ----------------------------------------------------------------------------------------------------------------
NAME_ATTRS = ("granularity", "fp8_recipe")


def layout_name_branches(source: str, names: set[str]) -> list[int]:
    """Lines that compare against a layout name, compare a layout-name attribute, or index a dict keyed by names."""

    def names_in(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_in(e) for e in node.elts)
        return isinstance(node, ast.Attribute) and node.attr in NAME_ATTRS

    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(names_in(n) for n in (node.left, *node.comparators)):
            hits.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            if any(isinstance(k, ast.Constant) and k.value in names for k in node.value.keys):
                hits.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and names_in(node.value):
            hits.append(node.lineno)
    return hits


def test_the_checker_finds_each_kind_of_branch():
    names = set(layout_names())
    src = """
if recipe.granularity == "rowwise": pass
if name in ("blockwise", "x"): pass
layout = {"blockwise": 1, "tensorwise": 2}[name]
if "tensorwise" != other: pass
if qweight.granularity is not None: pass
match name:
    case "rowwise": pass
ok = {"blockwise": "blockwise"}  # a name map, not a dispatch
ok2 = recipe.layout.features.exact_gemm
"""
    assert layout_name_branches(src, names) == [2, 3, 4, 5, 6, 8]


def test_no_module_outside_precision_recipes_branches_on_a_layout_name():
    names = set(layout_names())
    recipes_dir = ROOT / "nemo_jetrl" / "precision" / "recipes"
    offenders = []
    for path in sorted((ROOT / "nemo_jetrl").rglob("*.py")):
        if recipes_dir in path.parents:
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in layout_name_branches(path.read_text(), names)]
    assert offenders == []
