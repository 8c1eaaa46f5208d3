"""Tensor parallel for HF Llama / Qwen2 / Qwen3 decoder blocks with FP8 linears: the trainer (torch's DTensor TP,
composed with FSDP2 on a 2-D (dp, tp) mesh, see `fsdp.shard_policy`) and the colocated rollout replica.

Plan (Megatron's split, as NeMo-RL's DTensor plans for these models): q/k/v/gate/up column-parallel (rows of
W [N, K] sharded, `Shard(0)`), o/down row-parallel (columns sharded, `Shard(1)`); embeddings, norms and lm_head
replicated. Each rank owns H/tp query heads and H_kv/tp KV heads (contiguous, so GQA pairs stay on one rank).

How the FP8 linear meets DTensor: torch's `ColwiseParallel` / `RowwiseParallel` partition the parameters into
DTensors (what FSDP2 composes with and what the optimizer, grad clipping and checkpoints see), while the hooks here
hand the module *local* tensors: `Fp8Linear` runs its FP8 math on `weight.to_local()` (each rank quantizes its own
shard; with every per-rank dim a multiple of 128 those tiles are exactly the full weight's tiles inside the shard,
and the scales shard with them), and two region ops (Megatron's f / g) communicate over the TP group:

    column-parallel input : identity forward, all-reduce of the input gradient backward
    row-parallel output   : all-reduce forward (fp32 partial sums from the FP8 GEMM, one rounding after the sum),
                            identity backward

Running DTensor ops inside the FP8 autograd function instead would need sharding rules for every quantizer op; the
local form keeps the single-device kernels unchanged. Qwen3's q_norm / k_norm weights see local heads only: their
gradients are summed over the TP group after the backward (`reduce_head_local_grads`).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from nemo_jetrl.precision.convert import is_fp8_layer
from nemo_jetrl.precision.linear import Fp8Linear, QuantizedInput, local_tensor, output_dtype
from nemo_jetrl.precision.recipe import PrecisionRecipe
from nemo_jetrl.precision.rollout_layers import build_rollout_replica
from nemo_jetrl.precision.weight_group import group_sibling_linears

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")
HEAD_LOCAL_NORMS = ("self_attn.q_norm", "self_attn.k_norm")


def _layers(model: nn.Module) -> nn.ModuleList:
    backbone = getattr(model, "model", None)
    if backbone is None or not hasattr(backbone, "layers"):
        raise ValueError(f"tensor parallel supports HF Llama/Qwen2/Qwen3 causal LMs, got {type(model).__name__}")
    return backbone.layers


def check_tp_heads(heads: int, kv_heads: int, tp: int) -> None:
    """Raise ValueError unless `tp` divides the query heads and the KV heads (each rank owns whole heads)."""
    if heads % tp or kv_heads % tp:
        raise ValueError(
            f"tensor_parallel_size {tp} must divide the query heads ({heads}) and the KV heads ({kv_heads})"
        )


def check_tp_model(model_name: str, tp: int) -> None:
    """ValueError naming `policy.dtensor_cfg.tensor_parallel_size` unless `tp` divides the model's query and KV heads
    (read from its config.json)."""
    from nemo_jetrl.models.loading import check_model_dir, resolve_model_dir

    config = check_model_dir(resolve_model_dir(model_name))
    heads = int(config["num_attention_heads"])
    try:
        check_tp_heads(heads, int(config.get("num_key_value_heads") or heads), tp)
    except ValueError as exc:
        raise ValueError(
            f"policy.dtensor_cfg.tensor_parallel_size: {exc} of policy.model_name {model_name!r}"
        ) from None


def check_tp_layout(model: nn.Module, tp: int, block: int = 128) -> None:
    """Raise ValueError (naming the layer and sizes) unless `tp` splits heads and FP8 tiles cleanly."""
    cfg = model.config
    check_tp_heads(int(cfg.num_attention_heads), int(cfg.num_key_value_heads), tp)
    for i, layer in enumerate(_layers(model)):
        for names, attr, kind in ((COLWISE, "out_features", "column"), (ROWWISE, "in_features", "row")):
            for name in names:
                module = layer.get_submodule(name)
                size = int(getattr(module, attr))
                where = f"layer 'model.layers.{i}.{name}' ({kind}-parallel)"
                if size % tp:
                    raise ValueError(f"{where}: {attr} {size} is not divisible by tensor_parallel_size {tp}")
                if is_fp8_layer(module) and (size // tp) % block:
                    raise ValueError(
                        f"{where}: {attr} {size} / tensor_parallel_size {tp} = {size // tp} is not a multiple of "
                        f"the FP8 block {block}; its 128x128 tiles would straddle the shard boundary (choose another "
                        "tensor_parallel_size or keep the layer in bf16)"
                    )
                if kind == "row" and module.bias is not None:
                    raise ValueError(f"{where}: a row-parallel layer with a bias is not supported")


class _CopyToTP(torch.autograd.Function):
    """Identity forward; the input gradient is summed over the TP group (column-parallel input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce (sum) over the TP group forward; identity backward (row-parallel output)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _group(mesh_or_group):
    return mesh_or_group.get_group() if isinstance(mesh_or_group, DeviceMesh) else mesh_or_group


def _copy_input(module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
    if not torch.is_grad_enabled():
        return inputs
    return (_CopyToTP.apply(inputs[0], _group(mesh)), *inputs[1:])


def _note_output_dtype(module: nn.Module, inputs: tuple, mesh) -> tuple:
    x = inputs[0]  # what the module returns without TP:
    module._tp_output_dtype = x.out_dtype if isinstance(x, QuantizedInput) else output_dtype(x)
    return inputs


def _reduce_output(module: nn.Module, output: torch.Tensor, mesh) -> torch.Tensor:
    return _ReduceFromTP.apply(output, _group(mesh)).to(module._tp_output_dtype)


def _as_fp8_module(module: nn.Module) -> Fp8Linear:
    if isinstance(module, Fp8Linear):
        return module
    if isinstance(module, nn.Linear):  # a BF16 layer: an Fp8Linear with both flags off runs F.linear on the shard
        return Fp8Linear.from_linear(module, PrecisionRecipe.preset("jetrl"), train_fp8=False, rollout_fp8=False)
    raise ValueError(f"tensor parallel: expected a linear layer, got {type(module).__name__}")


class Fp8ColwiseParallel(ColwiseParallel):
    """`ColwiseParallel` (weight/bias `Shard(0)`) for `Fp8Linear`: the forward runs on the local shard."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.out_features //= device_mesh.size()
        return distribute_module(module, device_mesh, self._partition_linear_fn, _copy_input, None)


class Fp8RowwiseParallel(RowwiseParallel):
    """`RowwiseParallel` (weight `Shard(1)`) for `Fp8Linear`: local FP8 GEMM in fp32, all-reduced, then rounded."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.in_features //= device_mesh.size()
        module.partial_dtype = torch.float32
        return distribute_module(module, device_mesh, self._partition_linear_fn, _note_output_dtype, _reduce_output)


def _swap_plan_linears(model: nn.Module) -> None:
    for layer in _layers(model):
        for name in (*COLWISE, *ROWWISE):
            parent_name, _, child = name.rpartition(".")
            parent = layer.get_submodule(parent_name)
            setattr(parent, child, _as_fp8_module(getattr(parent, child)))


def parallelize_decoder(model: nn.Module, mesh: DeviceMesh, block: int = 128) -> None:
    """Apply the TP plan to every decoder block of `model` in place (after `convert_to_fp8`, before FSDP2)."""
    tp = mesh.size()
    check_tp_layout(model, tp, block)
    _swap_plan_linears(model)
    plan = {**{n: Fp8ColwiseParallel() for n in COLWISE}, **{n: Fp8RowwiseParallel() for n in ROWWISE}}
    for layer in _layers(model):
        parallelize_module(layer, mesh, plan)
    for m in model.modules():  # FSDP2 unshards members one by one: no shared q/k/v, gate/up buffer in the trainer
        if isinstance(m, Fp8Linear):
            m.invalidate_quantized_weight()
            m.weight_group = None


def reduce_head_local_grads(model: nn.Module, group) -> None:
    """Sum q_norm / k_norm weight gradients over the TP group (each rank saw only its heads)."""
    for layer in _layers(model):
        for name in HEAD_LOCAL_NORMS:
            module = getattr(layer.self_attn, name.rpartition(".")[2], None)
            for p in module.parameters() if module is not None else ():
                if p.grad is not None:
                    dist.all_reduce(local_tensor(p.grad), group=group)


# ---------------------------------------------------------------------------------------------------- rollout
def _narrow_linear(module: nn.Module, dim: int, rank: int, tp: int) -> None:
    size = module.weight.shape[dim] // tp
    with torch.no_grad():
        module.weight = nn.Parameter(module.weight.detach().narrow(dim, rank * size, size).clone())
        if dim == 0 and module.bias is not None:
            module.bias = nn.Parameter(module.bias.detach().narrow(0, rank * size, size).clone())
    if dim == 0:
        module.out_features = size
    else:
        module.in_features = size
    if isinstance(module, Fp8Linear):
        module.invalidate_quantized_weight()


def build_tp_rollout_replica(model: nn.Module, rank: int, tp: int, group, block: int = 128) -> nn.Module:
    """The rollout replica of TP rank `rank` from an unsharded (FP8-converted) policy: its column-parallel rows and
    row-parallel columns, H/tp and H_kv/tp heads (config too, so KV caches hold only this rank's heads), and
    row-parallel outputs all-reduced over `group`. Call before sharding the trainer."""
    check_tp_layout(model, tp, block)
    local = copy.deepcopy(model)
    for layer in _layers(local):
        for name in COLWISE:
            _narrow_linear(layer.get_submodule(name), 0, rank, tp)
        for name in ROWWISE:
            _narrow_linear(layer.get_submodule(name), 1, rank, tp)
    local.config.num_attention_heads //= tp
    local.config.num_key_value_heads //= tp
    group_sibling_linears(local)
    replica = build_rollout_replica(local)
    for layer in _layers(replica):
        for name in ROWWISE:  # fp32 partial sums, all-reduced, rounded once: as the trainer's row-parallel layers
            module = layer.get_submodule(name)
            module.partial_dtype = torch.float32
            module.register_forward_pre_hook(lambda m, inputs: _note_output_dtype(m, inputs, group))
            module.register_forward_hook(lambda m, inputs, out: _reduce_output(m, out, group))
    return replica
