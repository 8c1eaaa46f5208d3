"""The trainer's grouped FP8 projections (`GroupedFp8LinearFunction`): the per-linear products, input gradient and
weight / bias gradients of every member from one GEMM per pass, on the CPU's emulated GEMM; and which linears the
trainer groups (`trains_grouped`)."""

from types import SimpleNamespace

import pytest
import torch

from nemo_jetrl.precision import Fp8Linear, Fp8WeightGroup, FpropKernel, PrecisionRecipe
from nemo_jetrl.precision.grouped_linear import grouped_train_projections, trains_grouped
from nemo_jetrl.utils.columns import join_columns

SPLITS, K, M = (256, 128, 128), 256, 160  # M not a multiple of 128: WGrad pads the tokens


def members(recipe: PrecisionRecipe, bias: bool, seed: int = 0) -> list[Fp8Linear]:
    torch.manual_seed(seed)
    ms = [Fp8Linear(K, n, bias=bias, recipe=recipe) for n in SPLITS]
    if bias:
        with torch.no_grad():
            for m in ms:
                m.bias.normal_()
    return ms


def grads(ys, x, ms, dys):
    torch.autograd.backward(ys, dys)
    return x.grad, [m.weight.grad for m in ms], [None if m.bias is None else m.bias.grad for m in ms]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("wgrad_x_blocks", ["1x128", "128x128"])
def test_grouped_pass_equals_the_members_own_passes(bias, wgrad_x_blocks):
    recipe = PrecisionRecipe.preset("jetrl", wgrad_x_blocks=wgrad_x_blocks)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(2, M // 2, K, generator=gen)
    dys = [torch.randn(2, M // 2, n, generator=gen) for n in SPLITS]
    runs = []
    for grouped in (False, True):
        ms = members(recipe, bias)
        group = Fp8WeightGroup(ms)
        x = x0.clone().requires_grad_(True)
        ys = grouped_train_projections(x, group) if grouped else [m(x) for m in ms]
        assert [tuple(y.shape) for y in ys] == [(2, M // 2, n) for n in SPLITS]
        runs.append(([y.detach() for y in ys], *grads(ys, x, ms, dys)))
    (y0, dx0, dw0, db0), (y1, dx1, dw1, db1) = runs
    # the same FP8 operands and one fp32 product per element: equal up to the emulation's summation order
    for a, b in zip(y1, y0):
        assert rel(a, b) < 1e-6
    assert rel(dx1, dx0) < 1e-6  # one DGrad over sum N_i == the sum of the members' DGrads
    for a, b in zip(dw1, dw0):
        assert rel(a, b) < 1e-6  # each member's rows of the one WGrad
    for a, b in zip(db1, db0):
        assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-6, atol=1e-5)
    # and they are FP8 products: against the unquantized product the error is the e4m3 one, not zero
    ms = members(recipe, bias)
    exact = x0 @ ms[0].weight.detach().t() + (ms[0].bias.detach() if bias else 0)
    assert 1e-3 < rel(y1[0], exact) < 0.1


def test_member_gradients_side_by_side_join_without_a_copy(monkeypatch):
    # the members' output gradients as column views of one buffer (what the fused SiLU*up backward hands back):
    # dY is that buffer itself, and every gradient equals the one from separate (concatenated) tensors
    from nemo_jetrl.precision import grouped_linear

    joined = []

    def recording_join(parts):
        out = join_columns(parts)
        joined.append(out.data_ptr() == parts[0].data_ptr() and out.shape[-1] == sum(SPLITS))
        return out

    monkeypatch.setattr(grouped_linear, "join_columns", recording_join)
    recipe = PrecisionRecipe.preset("jetrl")
    dy = torch.randn(M, sum(SPLITS), generator=torch.Generator().manual_seed(3))
    runs = []
    for side_by_side in (False, True):
        ms = members(recipe, bias=True)
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(4)).requires_grad_(True)
        parts = dy.split(SPLITS, -1)
        dys = parts if side_by_side else [p.clone() for p in parts]
        runs.append(grads(grouped_train_projections(x, Fp8WeightGroup(ms)), x, ms, dys))
    assert joined == [False, True]
    (dx0, dw0, db0), (dx1, dw1, db1) = runs
    assert torch.equal(dx0, dx1) and all(torch.equal(a, b) for a, b in zip(dw0 + db0, dw1 + db1))
    assert float(dx0.abs().sum()) > 0


def test_only_the_dy_columns_of_a_member_reach_its_weight_gradient():
    ms = members(PrecisionRecipe.preset("jetrl"), bias=False)
    group = Fp8WeightGroup(ms)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    ys = grouped_train_projections(x, group)
    ys[1].sum().backward()  # only k's output is used
    assert torch.count_nonzero(ms[0].weight.grad) == 0 and torch.count_nonzero(ms[2].weight.grad) == 0
    assert torch.count_nonzero(ms[1].weight.grad) > 0
    assert torch.count_nonzero(x.grad) > 0 and torch.isfinite(x.grad).all()


def test_which_linears_the_trainer_groups():
    recipe = PrecisionRecipe.preset("jetrl")
    ms = members(recipe, bias=False)
    group = Fp8WeightGroup(ms)
    cuda_x = SimpleNamespace(is_cuda=True)  # the device is all trains_grouped reads of x
    assert trains_grouped(cuda_x, ms, group)
    assert not trains_grouped(torch.zeros(1, K), ms, group)  # off CUDA: the per-linear emulation keeps its bits
    assert not trains_grouped(cuda_x, ms[:2], group)  # not the whole group
    assert not trains_grouped(cuda_x, ms, None)
    group.train_grouped = False  # the per-linear ablation
    assert not trains_grouped(cuda_x, ms, group)
    group.train_grouped = True
    ms[0].fprop_kernel = FpropKernel.CUBLAS  # matched kernels keep per-linear cuBLAS forwards
    assert not trains_grouped(cuda_x, ms, group)
    ms[0].fprop_kernel = FpropKernel.AUTO
    for m in ms:
        m.mode = "rollout"
    assert not trains_grouped(cuda_x, ms, group)  # the rollout's grouped forward is its own path
    rowwise = members(PrecisionRecipe.preset("jetrl", granularity="rowwise"), bias=False)
    assert not trains_grouped(cuda_x, rowwise, Fp8WeightGroup(rowwise))


def test_transient_group_weights_under_checkpointing_give_the_cached_gradients():
    """Transient members (`use_transient_fp8_weights`) under activation checkpointing: the grouped pass keeps its
    buffer as saved tensors, which the recomputation rebuilds, so once the layer released it nothing holds the
    forward's buffer; outputs and gradients are bitwise the cached run's."""
    import gc
    import weakref

    from torch import nn

    from nemo_jetrl.models.recompute import checkpoint_layer
    from nemo_jetrl.precision import release_fp8_weights, use_transient_fp8_weights

    recipe = PrecisionRecipe.preset("jetrl")
    gen = torch.Generator().manual_seed(2)
    x0 = torch.randn(2, M // 2, K, generator=gen)
    dy = torch.randn(2, M // 2, sum(SPLITS), generator=gen)
    runs = {}
    for transient in (False, True):
        ms = members(recipe, bias=True)
        group, layer = Fp8WeightGroup(ms), nn.ModuleList(ms)
        assert use_transient_fp8_weights(layer, on=transient) == 3
        made = []

        def run(x_in, delta_in, hook, group=group, made=made):
            ys = grouped_train_projections(x_in, group)
            made.append(weakref.ref(group.cached_quantized_weight))
            return torch.cat(ys, -1), ys[0].sum()  # [2, M/2, sum N_i], a scalar

        x = x0.clone().requires_grad_(True)
        out, extra = checkpoint_layer(run, x, None, None, lambda layer=layer: release_fp8_weights(layer))
        gc.collect()
        alive = made[0]() is not None
        torch.autograd.backward([out, extra], [dy, torch.zeros(())])
        runs[transient] = (out.detach(), x.grad, [m.weight.grad for m in ms], [m.bias.grad for m in ms], alive)
    (y0, dx0, dw0, db0, alive0), (y1, dx1, dw1, db1, alive1) = runs[False], runs[True]
    assert (alive0, alive1) == (True, False)  # cached: the group holds it; transient: released, not on the graph
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0) and dx0.abs().sum() > 0
    for a, b in zip([*dw1, *db1], [*dw0, *db0]):
        assert torch.equal(a, b)
