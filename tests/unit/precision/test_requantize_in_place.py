"""FP8 weights re-quantized in place (what a captured training step reads): the bits of a fresh quantization, in the
very tensors the cache held (grouped buffers, DGrad operands and counts included), for every recipe granularity;
and the DGrad operand made per backward (`cache_dgrad_weight: false`) gives the cached one's gradients."""

import pytest
import torch

from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.policy.nonfinite import _fp8_ok_flags, fp8_weights_finite
from nemo_jetrl.policy.train_graphs import requantize_fp8_in_place
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.recipes.axis import dgrad_weight


def fp8_layers(granularity: str):
    model = random_tiny_qwen3(0, num_layers=2)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl", granularity=granularity, cache_dgrad_weight=True))
    return model, [m for m in model.modules() if isinstance(m, Fp8Linear)]


def snapshot(m: Fp8Linear) -> dict[str, torch.Tensor]:
    qw = m.quantized_weight()
    out = {"data": qw.data.view(torch.uint8), "scale": qw.scale, "nonfinite": qw.nonfinite}
    if qw.granularity == "blockwise":
        data_t, scale_t = qw.transposed()
        out.update(data_t=data_t.view(torch.uint8), scale_t=scale_t)
    else:  # the rowwise / tensorwise DGrad operand: a second cast of the master W, or the FProp bits transposed
        data_t, scale_t, dequant = dgrad_weight(qw, m.weight, m.recipe)
        out.update(dgrad_data=data_t.view(torch.uint8), dgrad_scale=scale_t, dgrad_dequant=dequant.view(torch.int32))  # NaN-safe
    group = m.weight_group.quantized_weight() if m.weight_group is not None else None
    if group is not None:
        out.update(group_data=group.data.view(torch.uint8), group_scale=group.scale, group_count=group.nonfinite)
    return out


@pytest.mark.parametrize("granularity", ["blockwise", "rowwise", "tensorwise"])
def test_in_place_requantization_writes_fresh_bits_into_the_held_tensors(granularity):
    model, layers = fp8_layers(granularity)
    held = [snapshot(m) for m in layers]  # caches (and transposes) as a captured step would read them
    pointers = [{k: v.data_ptr() for k, v in h.items()} for h in held]
    copies = [{k: v.clone() for k, v in h.items()} for h in held]
    with torch.no_grad():
        for i, m in enumerate(layers):  # as a fused optimizer writes: versions untouched
            m.weight.mul_(1.5 + 0.25 * i)
            if i == 3:
                m.weight[0, 0] = float("nan")
    requantize_fp8_in_place(model.modules())
    assert [{k: v.data_ptr() for k, v in snapshot(m).items()} for m in layers] == pointers  # the same storage...
    for m in layers:
        m.invalidate_quantized_weight()
    for m, h, before in zip(layers, held, copies):
        fresh = snapshot(m)  # ...holding a fresh quantization's bits
        for k in h:
            assert torch.equal(h[k], fresh[k]), k
        assert not torch.equal(h["scale"], before["scale"])  # the weights moved
    assert int(layers[3].quantized_weight().nonfinite) == 1


def test_in_place_requantization_quantizes_afresh_when_the_master_weight_was_replaced():
    model, layers = fp8_layers("blockwise")
    m = layers[-1]  # down_proj: not in a weight group
    assert m.weight_group is None
    old = m.quantized_weight()
    m.weight = torch.nn.Parameter(m.weight.detach() * 2)  # new storage: a graph holding `old` must see it replaced
    m.requantize_in_place()
    new = m.quantized_weight()
    assert new is not old and new.data.data_ptr() != old.data.data_ptr()
    m.invalidate_quantized_weight()
    assert torch.equal(new.data.view(torch.uint8), m.quantized_weight().data.view(torch.uint8))


@pytest.mark.parametrize("granularity", ["blockwise", "rowwise", "tensorwise"])
def test_dgrad_operand_made_per_backward_gives_the_cached_ones_gradients(granularity):
    torch.manual_seed(0)
    base = torch.nn.Linear(256, 384, bias=False)
    x = torch.randn(2, 96, 256)
    grads = {}
    for cache in (True, False):
        recipe = PrecisionRecipe.preset("jetrl", granularity=granularity, cache_dgrad_weight=cache)
        m = Fp8Linear.from_linear(torch.nn.Linear(256, 384, bias=False), recipe)
        m.weight = torch.nn.Parameter(base.weight.detach().clone())
        xi = x.clone().requires_grad_(True)
        m(xi).square().sum().backward()
        held = m.quantized_weight()._cache
        assert ("data_t" in held or "dgrad" in held) == cache  # W^T held between backwards only when cached
        grads[cache] = (xi.grad, m.weight.grad)
    assert grads[True][0].abs().sum() > 0
    for a, b in zip(grads[True], grads[False]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("granularity", ["blockwise", "rowwise", "tensorwise"])
def test_fp8_weight_check_in_a_few_launches_gives_the_per_layer_verdict(granularity):
    model, layers = fp8_layers(granularity)

    def per_layer() -> bool:
        _, scale_ok, weight_ok = _fp8_ok_flags(model)
        return all(bool(ok) for ok in scale_ok + weight_ok)

    assert bool(fp8_weights_finite(model)) and per_layer()
    with torch.no_grad():  # a NaN in a master weight: the quantizer's count sees it (its scales stay finite)
        layers[3].weight[0, 0] = float("nan")
    requantize_fp8_in_place(model.modules())
    assert bool(layers[3].quantized_weight().scale.isfinite().all())
    assert not bool(fp8_weights_finite(model)) and not per_layer()
    model, layers = fp8_layers(granularity)
    layers[-1].quantized_weight().scale.view(-1)[0] = float("inf")  # a corrupted scale
    assert not bool(fp8_weights_finite(model)) and not per_layer()
    down = layers[-1]  # a cache made without a count: the master weight itself is read instead
    down.invalidate_quantized_weight()
    data, scale, _ = down.quantize_weight()
    down.set_quantized_weight(data, scale, down.weight_key(), None)
    assert bool(fp8_weights_finite(model))
    with torch.no_grad():  # (in place, no version bump through .data: the cache stays)
        down.weight.data[0, 0] = float("inf")
    assert down.quantized_weight().nonfinite is None
    assert not bool(fp8_weights_finite(model)) and not per_layer()

