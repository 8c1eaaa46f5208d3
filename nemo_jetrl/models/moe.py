"""Mixture-of-experts layers (Qwen3-MoE) in the one decoder forward: router, token permutation, experts, combine.

`convert_moe_blocks(model)` replaces each HF sparse MoE block (`Qwen3MoeSparseMoeBlock`: a top-k softmax router
and E gated experts, no shared expert) by a `MoeBlock` over the very same Parameters, under the same state-dict
names (`mlp.gate.weight`, `mlp.experts.gate_up_proj` [E, 2F, H], `mlp.experts.down_proj` [E, H, F]), so HF
checkpoints load and export as they are. `decoder_forward` calls it where it calls a dense MLP (`mlp(h)`), for the
trainer and the rollout alike.

    logits = h W_gate^T                  FP32 on both sides (`RouterLinear`; batch-invariant in the exact mode and
                                         with matched kernels), never FP8 (the layer map keeps the router out)
    p = softmax(logits); top-k of p      HF's routing (renormalized over the k when `norm_topk_prob`, the k summed
                                         slot by slot)
    rows sorted by expert                (stable sort of the T*k choices, counts by scatter-add: no host sync)
    y_e = down_e(silu(gate_e(x)) * up_e(x))  per expert over its rows (`precision.expert_linear`)
    out[t] = sum_j p[t, j] * y_{e_j}[t]  in FP32, slot by slot in a fixed order (row-local: batch-invariant)

Observers (`models/moe_routing.py`) see each block's router logits and choices: the rollout records its choices
per token (`train/routing_agreement`), the trainer its own, and the load-balancing loss reads the logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from nemo_jetrl.precision.expert_linear import ExpertLinear, ExpertSplit, Fp8ExpertLinear, RouterLinear
from nemo_jetrl.precision.layer_map import decoder_layer_index

# observer(moe_index, logits [T, E] fp32, experts [T, k] long, lead_shape (B, S)) -> None
MoeObserver = Callable[[int, torch.Tensor, torch.Tensor, tuple[int, ...]], None]
_EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def route(logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's top-k softmax routing: logits [T, E] -> (weights fp32 [T, k], experts long [T, k]), by probability."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # [T, E]
    weights, experts = torch.topk(probs, top_k, dim=-1)  # [T, k] each
    if norm_topk_prob:  # summed slot by slot (elementwise adds): no reduction kernel whose order follows T
        total = weights[:, :1]
        for j in range(1, top_k):
            total = total + weights[:, j : j + 1]
        weights = weights / total
    return weights, experts


class MoeExperts(nn.Module):
    """E gated experts: `gate_up_proj` [E, 2F, H] (gate rows first, then up) and `down_proj` [E, H, F] as
    `ExpertLinear`s (FP8 after `convert_to_fp8`); the state dict keeps HF's names (no `.weight` suffix)."""

    def __init__(self, gate_up_proj: nn.Parameter, down_proj: nn.Parameter, act_fn: nn.Module) -> None:
        super().__init__()
        self.gate_up_proj = ExpertLinear(gate_up_proj)
        self.down_proj = ExpertLinear(down_proj)
        self.act_fn = act_fn
        self.num_experts = gate_up_proj.shape[0]
        self.register_state_dict_post_hook(_hf_names)
        self.register_load_state_dict_pre_hook(_module_names)

    def forward(self, h2: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """h2 [T, H], weights fp32 [T, k], experts [T, k] -> [T, H] in the experts' output dtype."""
        tokens, top_k = experts.shape
        flat = experts.reshape(-1)  # [T*k] (token, slot) order
        order = torch.argsort(flat, stable=True)  # [T*k]: rows sorted by expert, token order within an expert
        counts = torch.zeros(self.num_experts, dtype=torch.long, device=flat.device)
        split = ExpertSplit(counts.scatter_add_(0, flat, torch.ones_like(flat)))  # [E] rows per expert
        xs = h2.index_select(0, order // top_k)  # [T*k, H]
        gate_up = self.gate_up_proj(xs, split)  # [T*k, 2F]
        inter = gate_up.shape[-1] // 2
        ys = self.down_proj(self.act_fn(gate_up[:, :inter]) * gate_up[:, inter:], split)  # [T*k, H]
        y = ys.index_select(0, torch.argsort(order)).view(tokens, top_k, -1)  # [T, k, H] back in (token, slot) order
        out = y[:, 0].float() * weights[:, :1]  # [T, H] fp32, one slot at a time (the same order for every row)
        for j in range(1, top_k):
            out = out + y[:, j].float() * weights[:, j : j + 1]
        return out.to(ys.dtype)


def _hf_names(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    for name in _EXPERT_PARAMS:
        if f"{prefix}{name}.weight" in state_dict:
            state_dict[f"{prefix}{name}"] = state_dict.pop(f"{prefix}{name}.weight")


def _module_names(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    for name in _EXPERT_PARAMS:
        if f"{prefix}{name}" in state_dict:
            state_dict[f"{prefix}{name}.weight"] = state_dict.pop(f"{prefix}{name}")


class MoeBlock(nn.Module):
    """A sparse MoE block: `gate` (`RouterLinear` [E, H]) and `experts` (`MoeExperts`); forward(h [..., H])."""

    def __init__(self, gate: RouterLinear, experts: MoeExperts, top_k: int, norm_topk_prob: bool, moe_index: int):
        super().__init__()
        self.gate, self.experts = gate, experts
        self.top_k, self.norm_topk_prob = int(top_k), bool(norm_topk_prob)
        self.moe_index = moe_index  # this block's index among the model's MoE blocks (routing records)
        self.observers: tuple[MoeObserver, ...] = ()  # set for a forward by `moe_routing.observing`

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        lead = tuple(h.shape[:-1])
        h2 = h.reshape(-1, h.shape[-1])  # [T, H]
        logits = self.gate(h2)  # [T, E] fp32
        weights, experts = route(logits, self.top_k, self.norm_topk_prob)  # [T, k] each
        for observe in self.observers:
            observe(self.moe_index, logits, experts, lead)
        return self.experts(h2, weights, experts).view(*lead, -1)

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, norm_topk_prob={self.norm_topk_prob}, moe_index={self.moe_index}"


def is_hf_sparse_block(module: nn.Module) -> bool:
    """An HF top-k MoE block (Qwen3-MoE layout): `gate` with a [E, H] weight and top_k, `experts` with 3D weights."""
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    return (
        gate is not None
        and hasattr(gate, "top_k")
        and isinstance(getattr(gate, "weight", None), torch.Tensor)
        and all(isinstance(getattr(experts, n, None), nn.Parameter) for n in _EXPERT_PARAMS)
    )


def convert_moe_blocks(model: nn.Module) -> int:
    """Replace every HF sparse MoE block of `model` by a `MoeBlock` (same Parameters, same state-dict names); returns
    the number of MoE blocks the model has. Blocks with a shared expert (Qwen2-MoE) are refused."""
    index = len(moe_blocks(model))
    for name, module in list(model.named_modules()):
        if not is_hf_sparse_block(module):
            continue
        if hasattr(module, "shared_expert"):
            raise ValueError(f"{name}: MoE blocks with a shared expert (Qwen2-MoE) are not supported; Qwen3-MoE is")
        if decoder_layer_index(name) is None:
            raise ValueError(f"{name}: an MoE block outside the decoder layers")
        gate = RouterLinear.from_weight(module.gate.weight)
        experts = MoeExperts(module.experts.gate_up_proj, module.experts.down_proj, module.experts.act_fn)
        block = MoeBlock(gate, experts, module.gate.top_k, module.gate.norm_topk_prob, index)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, block)
        index += 1
    return index


def moe_blocks(model: nn.Module) -> list[MoeBlock]:
    """The model's `MoeBlock`s in module order (their `moe_index` order)."""
    return [m for m in model.modules() if isinstance(m, MoeBlock)]


def is_moe(model: nn.Module) -> bool:
    """Whether the model has MoE blocks (converted by `convert_moe_blocks`)."""
    return any(isinstance(m, MoeBlock) for m in model.modules())


def moe_shape(model: nn.Module) -> tuple[int, int, int]:
    """(MoE blocks L, experts E, top-k k) of a converted model."""
    blocks = moe_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no MoE blocks")
    return len(blocks), blocks[0].experts.num_experts, blocks[0].top_k


def split_expert_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF's on-disk expert layout (what `save_pretrained` writes and vLLM reads): each `<p>.experts.gate_up_proj`
    [E, 2F, H] becomes `<p>.experts.<e>.gate_proj.weight` / `.up_proj.weight` [F, H], each `<p>.experts.down_proj`
    [E, H, F] becomes `<p>.experts.<e>.down_proj.weight`; other tensors as they are, in order."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        base, _, name = key.rpartition(".")
        if not base.endswith(".experts") or name not in _EXPERT_PARAMS or value.dim() != 3:
            out[key] = value
            continue
        for e, w in enumerate(value.unbind(0)):
            if name == "down_proj":
                out[f"{base}.{e}.down_proj.weight"] = w
            else:
                gate, up = w.chunk(2, dim=0)
                out[f"{base}.{e}.gate_proj.weight"], out[f"{base}.{e}.up_proj.weight"] = gate, up
    return out


def decode_syncs_host(model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether an MoE model's rollout forward in `dtype` on CUDA reads expert counts on the host: its decode step
    cannot be captured in a CUDA graph (the engine runs it eagerly)."""
    return any(m.syncs_on_host(dtype) for m in model.modules() if isinstance(m, ExpertLinear | Fp8ExpertLinear))
