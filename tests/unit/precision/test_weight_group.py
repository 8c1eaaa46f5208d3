"""Sibling FP8 weights in one buffer: same bits as per-linear quantization, refresh on change, one grouped GEMM."""

import pytest
import torch
from torch import nn

from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import (
    Fp8Linear,
    Fp8WeightGroup,
    PrecisionRecipe,
    convert_to_fp8,
    group_sibling_linears,
    project_shared_input,
    weight_quant,
)
from nemo_jetrl.precision.weight_group import grouping_problem

RECIPE = PrecisionRecipe.preset("jetrl")


def fp8_tiny(seed: int = 0) -> nn.Module:
    model = random_tiny_qwen3(seed, num_layers=2)
    convert_to_fp8(model, RECIPE)
    return model


def linears(n_out: tuple[int, ...], k: int = 256, bias: bool = False, seed: int = 0) -> list[Fp8Linear]:
    torch.manual_seed(seed)
    return [Fp8Linear(k, n, bias=bias, recipe=RECIPE) for n in n_out]


def test_convert_groups_qkv_and_gate_up_into_one_buffer_with_the_same_bits():
    model = fp8_tiny()
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
    group = attn.q_proj.weight_group
    assert isinstance(group, Fp8WeightGroup) and group.members == qkv and group.splits == (256, 128, 128)
    assert mlp.gate_proj.weight_group.members == (mlp.gate_proj, mlp.up_proj)
    assert layer.self_attn.o_proj.weight_group is None and mlp.down_proj.weight_group is None
    buffer = group.quantized_weight()
    assert tuple(buffer.data.shape) == (512, 256) and tuple(buffer.scale.shape) == (4, 2)
    row = 0
    for m in qkv:
        qw = m.quantized_weight()
        data, scale = weight_quant(m.weight.detach(), 128)
        assert torch.equal(qw.data.view(torch.uint8), data.view(torch.uint8)) and torch.equal(qw.scale, scale)
        # a view of the shared buffer, not a copy
        assert qw.data.data_ptr() == buffer.data.data_ptr() + row * 256
        assert qw.data.untyped_storage().data_ptr() == buffer.data.untyped_storage().data_ptr()
        row += m.out_features


def test_a_changed_member_requantizes_the_group_and_keeps_the_others_bits():
    model = fp8_tiny()
    attn = model.model.layers[0].self_attn
    q_before = attn.q_proj.quantized_weight().data.clone()
    k_before = attn.k_proj.quantized_weight().data.clone()
    with torch.no_grad():
        attn.k_proj.weight.add_(torch.randn_like(attn.k_proj.weight))  # bumps k's version only
    k_after = attn.k_proj.quantized_weight()
    assert torch.equal(attn.q_proj.quantized_weight().data.view(torch.uint8), q_before.view(torch.uint8))
    assert not torch.equal(k_after.data.view(torch.uint8), k_before.view(torch.uint8))
    data, scale = weight_quant(attn.k_proj.weight.detach(), 128)
    assert torch.equal(k_after.data.view(torch.uint8), data.view(torch.uint8)) and torch.equal(k_after.scale, scale)
    # writes behind the version counter: invalidate one member, the group re-reads every weight
    attn.v_proj.weight.data.zero_()
    attn.v_proj.invalidate_quantized_weight()
    assert attn.q_proj.weight_group.quantized_weight().data[384:].float().abs().sum() == 0


def test_training_forward_and_backward_are_bitwise_unchanged_by_grouping():
    x = torch.randn(6, 256)
    outs = []
    for grouped in (False, True):
        members = linears((256, 128), bias=True)
        if grouped:
            Fp8WeightGroup(members)
        xi = x.clone().requires_grad_(True)
        y = torch.cat([m(xi) for m in members], dim=-1)
        y.pow(2).sum().backward()
        outs.append((y.detach(), xi.grad, [m.weight.grad for m in members]))
    (y0, gx0, gw0), (y1, gx1, gw1) = outs
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1)
    assert all(torch.equal(a, b) for a, b in zip(gw0, gw1))


def test_grouped_projection_matches_separate_gemms():
    members = linears((256, 128, 128), bias=True)
    group = Fp8WeightGroup(members)
    x = torch.randn(2, 3, 256)
    for m in members:
        m.mode = "rollout"
    with torch.no_grad():
        separate = project_shared_input(x, members, grouped=False)
        fused = project_shared_input(x, members, grouped=True)
        bias = group.bias()
    assert tuple(bias.shape) == (512,) and torch.equal(bias[256:384], members[1].bias.detach())
    for a, b, m in zip(fused, separate, members):
        assert a.shape == (2, 3, m.out_features)
        assert ((a - b).norm() / b.norm()).item() < 1e-6  # same FP8 products, FP32 accumulation order only
    # train mode: no shared quantization, no grouped GEMM (each linear's autograd path)
    for m in members:
        m.mode = "train"
    trained = project_shared_input(x, members, grouped=True)
    assert all(torch.equal(a, m(x)) for a, m in zip(trained, members))


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"n_out": (256, 100)}, "multiple of 128"),
        ({"n_out": (256,)}, "at least two"),
    ],
)
def test_grouping_problem_names_the_reason(kwargs, reason):
    members = linears(**kwargs)
    assert reason in grouping_problem(members)
    with pytest.raises(ValueError, match=reason):
        Fp8WeightGroup(members)


def test_incompatible_members_are_left_ungrouped():
    a, b = linears((128, 128))
    b.rollout_fp8 = False
    assert "differ" in grouping_problem([a, b])
    c, d = linears((128, 128))
    d.bias = nn.Parameter(torch.zeros(128))
    assert "bias" in grouping_problem([c, d])
    e, f = linears((128, 128))
    Fp8WeightGroup([e, linears((128,))[0]])
    assert "already" in grouping_problem([e, f])
    model = fp8_tiny()
    model.model.layers[1].mlp.up_proj.train_fp8 = False
    assert group_sibling_linears(model) == 3  # 2 attention groups + the first MLP; regrouping dissolves the old
    assert model.model.layers[1].mlp.gate_proj.weight_group is None


def test_rollout_replica_siblings_share_one_buffer_that_loads_update():
    from nemo_jetrl.precision.rollout_layers import Fp8RolloutGroup, build_rollout_replica

    model = fp8_tiny(seed=2)
    replica = build_rollout_replica(model)
    attn, r_attn = model.model.layers[0].self_attn, replica.model.layers[0].self_attn
    members = (r_attn.q_proj, r_attn.k_proj, r_attn.v_proj)
    group = r_attn.q_proj.weight_group
    assert isinstance(group, Fp8RolloutGroup) and group.members == members
    assert isinstance(replica.model.layers[1].mlp.up_proj.weight_group, Fp8RolloutGroup)
    buffer = group.quantized_weight()
    for trainer, rollout in zip((attn.q_proj, attn.k_proj, attn.v_proj), members):
        assert torch.equal(rollout.weight_fp8.view(torch.uint8), trainer.quantized_weight().data.view(torch.uint8))
        assert rollout.weight_fp8.untyped_storage().data_ptr() == buffer.data.untyped_storage().data_ptr()
    # a refit-style load into one member lands in the shared buffer the grouped GEMM reads
    new_data, new_scale = weight_quant(torch.randn(128, 256), 128)
    r_attn.k_proj.load(new_data, new_scale)
    assert torch.equal(buffer.data[256:384].view(torch.uint8), new_data.view(torch.uint8))
    assert torch.equal(buffer.scale[2:3], new_scale)
    x = torch.randn(2, 3, 256)
    with torch.no_grad():
        separate = project_shared_input(x, members)
        fused = project_shared_input(x, members, grouped=True)
        own = [m(x) for m in members]  # each linear quantizes x itself
    for a, b, c in zip(fused, separate, own):
        assert torch.equal(b, c)  # the shared quantization is bitwise each one's own
        assert ((a - b).norm() / b.norm()).item() < 1e-6


@pytest.mark.parametrize("drop", ["invalidate", "requantize_in_place"])
def test_the_trainers_cache_drop_after_a_step_also_drops_the_concatenated_bias(drop):
    ms = linears((128, 128), bias=True)
    group = Fp8WeightGroup(ms)
    group.quantized_weight()
    before = group.bias().clone()
    ms[1].bias.data.add_(1.0)  # as the fused AdamW writes: no version counter bumped
    assert torch.equal(group.bias(), before)  # the (version, pointer) key cannot see it...
    getattr(group, drop)()  # ...so the trainer's drop after every optimizer step must
    assert torch.equal(group.bias(), torch.cat([m.bias.detach() for m in ms]))
    assert not torch.equal(group.bias(), before)
