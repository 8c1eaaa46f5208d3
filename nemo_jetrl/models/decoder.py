"""The one decoder forward shared by the trainer (scoring, training) and the rollout engine (prefill, decode).

`decoder_forward` runs a HF Llama / Qwen2 / Qwen3 / Qwen3-MoE causal LM through its OWN submodules (embeddings,
norms, q/k/v/o projections, q/k-norm, MLP or MoE block (`models/moe.py`), rotary embedding), so whatever the
precision package swapped into the model (`Fp8Linear`) is used transparently and the rollout works on the trainer's
weights by reference. Only the attention is ours: `F.scaled_dot_product_attention` with an explicit boolean mask
(causal AND key-not-padding), which lets the same code serve full sequences and KV-cached chunks.

Rollout fast path (`ForwardPlan.fused`, the engine's fused decode on CUDA): the residual-add + RMSNorm, q/k-norm + RoPE
and SiLU * up glue run as single Triton kernels (`fused_ops.py`, same per-op roundings as the HF modules), and the FP8
linears that share an input (q/k/v, gate/up) run as one GEMM over their shared FP8 weight buffer
(`precision.weight_group`). On every path those linears quantize their common input once (bitwise the same); on the fast
path the norm / SiLU*up kernel that produces an FP8 linear's input writes it quantized (same bits).

Trainer fast path (`ForwardPlan.fused_train`, `scoring.sequence_logprobs`' default on CUDA): the same glue kernels with
their backward (`fused_train_ops.py`); the CPU path keeps the eager twins. Opt-in (`ForwardPlan.causal_attention`):
without a KV cache and when no row has a pad before a real token, causal SDPA with no mask (3x faster fwd+bwd on an H200
at 4K tokens; `scoring.sequence_logprobs` left-aligns the rows first). It rounds differently from the rollout's masked
prefill / decode attention, so it gives up bit-exact trainer == rollout logprobs (docs/mismatch.md).

Exact mode (`models.batch_invariant.enable_batch_invariant`, read off the model into each side's `ForwardPlan.exact`, so
trainer and rollout agree): every query of every path (decode, prefill, training) goes through
`batch_invariant_attention`, the linears run batch-invariant GEMMs, and on CUDA the glue runs the per-row Triton kernels
on both sides (the rollout's `fused`, the trainer's `fused_train`); the logprobs' log-sum-exp is
`batch_invariant.logsumexp_rows`. The rollout's RMSNorm writes the next FP8 linears' input quantized in the same
kernel, with the trainer's norm + cast bits at every activation dtype (`fused_ops._norm_store_run`: the two variants
sum the squares in one register layout, tests/unit/models/test_glue_norm_compiled.py).

Activation checkpointing (`ForwardPlan.activation_checkpointing`, `policy.dtensor_cfg.activation_checkpointing`): under
autograd each layer runs through `models/recompute.py`, keeping only its input (the residual sum made before it) and
recomputing its activations in the backward, bit for bit (the FP8 weights come from their caches; a hook's `replay` runs instead of the
hook itself).

Sequence layout (docs/architecture.md): prompts left-padded, responses right-padded, `attention_mask` 1 on real
tokens, `position_ids = cumsum(attention_mask) - 1` clamped at 0.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from nemo_jetrl.models import batch_invariant_attention, batch_invariant_train
from nemo_jetrl.models.batch_invariant import exact_parts
from nemo_jetrl.models.forward_plan import EAGER, NO_CACHE, AttnHook, DecoderCache, ForwardInputs, ForwardPlan
from nemo_jetrl.models.moe import is_hf_sparse_block
from nemo_jetrl.models.packed import PackedRows, varlen_causal_attention
from nemo_jetrl.models.recompute import checkpoint_layer, recomputes
from nemo_jetrl.models.sdpa import sdpa
from nemo_jetrl.precision.convert import release_fp8_weights
from nemo_jetrl.precision.linear import QuantizedInput, output_dtype
from nemo_jetrl.precision.op_input_linear import linear_after
from nemo_jetrl.precision.shared_input import shared_input_quant
from nemo_jetrl.precision.weight_group import project_shared_input

try:  # the fused kernels need triton (absent on some CPU-only installs: then `fused` / `fused_train` are ignored)
    from nemo_jetrl.models import fused_ops, fused_train_ops
except ImportError:  # pragma: no cover
    fused_ops = fused_train_ops = None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """`cumsum(attention_mask) - 1` clamped at 0: [B, S] -> [B, S] long (left pads get position 0)."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, S], got shape {tuple(attention_mask.shape)}")
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _backbone(model: nn.Module) -> nn.Module:
    """`model.model` of a HF causal LM, checked for the submodules the forward uses."""
    backbone = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if backbone is None or not all(hasattr(backbone, name) for name in needed):
        raise ValueError(
            f"decoder_forward supports HF Llama/Qwen2/Qwen3 causal LMs (model.model.{{{', '.join(needed)}}}); "
            f"got {type(model).__name__}"
        )
    layer_types = getattr(model.config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(f"decoder_forward supports full attention only; config.layer_types has {set(layer_types)}")
    if any(is_hf_sparse_block(layer.mlp) for layer in backbone.layers):  # the MoE block runs where the MLP does
        raise ValueError("decoder_forward: convert the HF MoE blocks first (models.moe.convert_moe_blocks)")
    return backbone


def _hf_attention_helpers(attn: nn.Module) -> tuple[Callable, Callable]:
    """`apply_rotary_pos_emb` and `repeat_kv` from the HF modeling module that defines `attn`'s class."""
    module = importlib.import_module(type(attn).__module__)
    try:
        return module.apply_rotary_pos_emb, module.repeat_kv
    except AttributeError as err:
        raise ValueError(f"{type(attn).__module__} has no apply_rotary_pos_emb/repeat_kv; model not supported") from err


def _param_dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def compute_context(model: nn.Module, device: torch.device, compute_dtype: torch.dtype | None):
    """autocast to `compute_dtype` when it differs from the parameters' dtype, else a null context."""
    if compute_dtype is None or compute_dtype == _param_dtype(model):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=compute_dtype)


def _attention_mask(attention_mask: torch.Tensor, num_queries: int, cache_start: int | torch.Tensor) -> torch.Tensor:
    """Boolean SDPA mask [B, 1, S_q, S_k]: key <= query (absolute positions) AND key is a real token.

    Query i sits at cache position `cache_start + i`. Each query may always see its own key: a left-pad query row
    would otherwise be fully masked and give NaN. Real queries never see pad keys, so this changes no real output.
    """
    device = attention_mask.device
    if isinstance(cache_start, torch.Tensor):  # [B] per-row starts (or one)
        q_pos = cache_start.to(device).reshape(-1, 1) + torch.arange(num_queries, device=device)  # [1 | B, S_q]
    else:  # no host -> device copy (it would sync the host with the device)
        q_pos = torch.arange(cache_start, cache_start + num_queries, device=device)[None]  # [1, S_q]
    k_pos = torch.arange(attention_mask.shape[1], device=device)  # [S_k]
    causal = k_pos <= q_pos[..., None]  # [1 | B, S_q, S_k]
    allowed = causal & attention_mask.bool()[:, None, :]  # [B, S_q, S_k]
    allowed = allowed | (k_pos == q_pos[..., None])
    return allowed[:, None]  # [B, 1, S_q, S_k]


def _right_padded(attention_mask: torch.Tensor) -> bool:
    """No row has a pad before a real token (then causal attention without a mask is exact on real tokens)."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, repeat_kv) -> torch.Tensor:
    """Causal attention, no mask: q [B, H, S, D], k/v [B, H_kv, S, D] -> [B, H, S, D]. Grouped K/V are read
    in place by the half-precision kernels (enable_gqa); FP32 repeats them (no GQA kernel takes FP32)."""
    if q.dtype in (torch.float16, torch.bfloat16):
        return sdpa(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    n_rep = q.shape[1] // k.shape[1]
    return sdpa(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True, scale=scale)


def _self_attention(
    attn: nn.Module,
    layer_idx: int,
    x: torch.Tensor | QuantizedInput,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor | PackedRows | None,
    kv_cache: DecoderCache | None,
    cache_start: int | torch.Tensor,
    attn_hook: AttnHook | None,
    compute_dtype: torch.dtype | None,
    glue=None,
    grouped: bool = False,
    key_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """One attention block over the layer's own projections; x: [B, S, hidden] (or its QuantizedInput) -> [B, S, hidden].

    glue: a fused-kernel module (`fused_ops`, `fused_train_ops`) or None (eager); grouped: one GEMM over the
    shared q/k/v FP8 buffer; mask None: causal attention without a mask (no cache, right-padded rows); mask
    PackedRows: varlen causal attention over one packed row; key_valid [B, S_total] bool: the exact mode's
    batch-invariant attention (the trainer's over padded rows, or over the packed row of a PackedRows mask)."""
    apply_rotary_pos_emb, repeat_kv = _hf_attention_helpers(attn)
    bsz, seq = x.lead_shape if isinstance(x, QuantizedInput) else x.shape[:2]
    head_dim = attn.head_dim
    # FP8: x quantized once for all three; grouped: one GEMM over the shared q/k/v FP8 buffer (column views)
    q, k, v = project_shared_input(x, (attn.q_proj, attn.k_proj, attn.v_proj), grouped=grouped)
    q = q.view(bsz, seq, -1, head_dim)  # [B, S, H, D]
    k = k.view(bsz, seq, -1, head_dim)  # [B, S, H_kv, D]
    v = v.view(bsz, seq, -1, head_dim)  # [B, S, H_kv, D]
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # Qwen3
    if glue is not None and fused_ops.qk_norm_rope_supported(q, q_norm) and fused_ops.qk_norm_rope_supported(k, k_norm):
        q = glue.qk_norm_rope(q, *_norm_args(q_norm), *cos_sin).transpose(1, 2)  # [B, H, S, D]
        k = glue.qk_norm_rope(k, *_norm_args(k_norm), *cos_sin).transpose(1, 2)  # [B, H_kv, S, D]
        v = v.transpose(1, 2)  # [B, H_kv, S, D]
    else:
        if q_norm is not None:
            q, k = q_norm(q), k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H(_kv), S, D]
        q, k = apply_rotary_pos_emb(q, k, *cos_sin)
    # Attention math runs in one dtype: the compute dtype, else the value projection's output dtype.
    attn_dtype = compute_dtype if compute_dtype is not None else v.dtype
    q, k, v = q.to(attn_dtype), k.to(attn_dtype), v.to(attn_dtype)
    if attn_hook is not None:
        q, k, v = attn_hook(layer_idx, q, k, v)
    if key_valid is not None and kv_cache is None:  # the trainer's, padded or packed rows (the rollout's kernel)
        rows = mask if isinstance(mask, PackedRows) else key_valid
        out = batch_invariant_train.trainer_attention(q, k, v, rows, attn.scaling)  # [B, H, S, D]
    elif key_valid is not None:
        out = batch_invariant_attention.decoder_attention(
            q, k, v, key_valid, kv_cache, layer_idx, cache_start, attn.scaling
        )  # [B, H, S, D]
    elif isinstance(mask, PackedRows):
        out = varlen_causal_attention(q, k, v, mask, attn.scaling, repeat_kv)  # [1, H, T, D]
    elif kv_cache is not None and kv_cache.uses_fused_decode(q):  # CUDA decode: attends over the stored cache
        out = kv_cache.decode_attention(layer_idx, q, k, v, cache_start, mask, attn.scaling)  # [B, H, 1, D]
    elif mask is None:
        out = _causal_sdpa(q, k, v, attn.scaling, repeat_kv)  # [B, H, S, D]
    else:
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v, cache_start)  # [B, H_kv, S_k, D]
        n_rep = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # [B, H, S_k, D]
        out = sdpa(q, k, v, attn_mask=mask, scale=attn.scaling)  # [B, H, S, D]
    out = out.transpose(1, 2).reshape(bsz, seq, -1)  # [B, S, H * D]
    return attn.o_proj(out)


def _norm_args(norm: nn.Module | None) -> tuple[torch.Tensor | None, float]:
    """(weight, eps) of a HF Llama/Qwen RMSNorm for the fused kernels; (None, 0.0) for no norm."""
    return (None, 0.0) if norm is None else (norm.weight, float(norm.variance_epsilon))


def residual_sum(x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
    """x + delta [B, S, H] (x when delta is None): the bits of the residual `_add_norm` and the fused add + norm
    kernels write (one FP32 add rounded once to the promoted dtype)."""
    return x if delta is None else x + delta


def _add_norm(
    x: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module, glue, consumers: tuple[nn.Module, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor | QuantizedInput]:
    """(x + delta, norm(x + delta)), delta None = no add; one kernel of `glue` when given and `norm` is fusable.
    consumers (rollout fast path): the FP8 linears reading the normed output, which then leaves the kernel
    quantized as their shared input."""
    if glue is not None and fused_ops.fusable_rms_norm(norm):
        quant = shared_input_quant(x.shape[-1], consumers)
        if quant is not None:
            res, data, scale = fused_ops.add_rms_norm_fp8(x, delta, *_norm_args(norm), *quant)
            out_dtype = output_dtype(x, fused_ops.normed_dtype(res.dtype, norm.weight.dtype))
            return res, QuantizedInput(data, scale, tuple(x.shape[:-1]), out_dtype)
        return glue.add_rms_norm(x, delta, *_norm_args(norm))
    x = residual_sum(x, delta)
    return x, norm(x)


def _mlp(mlp: nn.Module, h: torch.Tensor | QuantizedInput, glue, grouped: bool) -> torch.Tensor:
    """The gated MLP `down(act(gate(h)) * up(h))` (Llama/Qwen), gate/up sharing one FP8 input quantization."""
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return mlp(h)
    gate, up = project_shared_input(h, (mlp.gate_proj, mlp.up_proj), grouped=grouped)  # [B, S, F] each
    if glue is not None and fused_ops.is_silu(mlp.act_fn) and fused_ops.fused_ops_supported(gate):
        quant = shared_input_quant(gate.shape[-1], (mlp.down_proj,)) if grouped else None
        if quant is not None:  # the rollout: SiLU*up leaves the kernel as down_proj's FP8 input
            data, scale = fused_ops.silu_mul_fp8(gate, up, *quant)
            out_dtype = output_dtype(gate, fused_ops.normed_dtype(gate.dtype, up.dtype))
            return mlp.down_proj(QuantizedInput(data, scale, tuple(gate.shape[:-1]), out_dtype))
        if glue is fused_train_ops:  # the trainer: an FP8 down_proj frees the BF16 product before its GEMM
            return linear_after(mlp.down_proj, fused_train_ops.SiluMulInput, gate, up)
        return mlp.down_proj(glue.silu_mul(gate, up))
    return mlp.down_proj(mlp.act_fn(gate) * up)


def decoder_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    plan: ForwardPlan = EAGER,
    inputs: ForwardInputs = NO_CACHE,
) -> torch.Tensor:
    """Hidden states after the final norm, [B, S, H], by `plan` (models/forward_plan.py: dtype, glue kernels,
    attention, activation checkpointing, attention hook) over `inputs` (the KV cache and where the new tokens go,
    or the packed rows).

    input_ids / position_ids: [B, S]; attention_mask: [B, S_total] (1 real, 0 pad) over every key the queries may
    see. Without a cache S_total == S. With a cache, an int `cache_start` attends over the cache prefix
    (S_total == cache_start+S), a 0-dim or [B] LongTensor over the whole buffer (S_total == kv_cache.max_seq_len;
    a [B] one: one token per row, continuous batching, whose `PagedKVCache` serves every decode step itself).
    Packed rows: B = 1, no cache, position_ids = packed.position_ids. plan.causal_attention applies where there is
    no cache and no row has a pad before a real token (else the explicit mask, as always); the device check
    `inputs.right_padded` spares is a host sync a captured step cannot make. Activation checkpointing applies under
    autograd and without a cache (models/recompute.py; same numbers, bit for bit).
    """
    bsz, seq = _check_shapes(input_ids, position_ids, attention_mask, inputs)
    kv_cache, cache_start, packed = inputs.kv_cache, inputs.cache_start, inputs.packed
    backbone = _backbone(model)
    parts = plan.exact  # the exact mode: all; the mismatch ablation / matched kernels: some
    if parts != exact_parts(model):
        raise ValueError(
            f"decoder_forward: the plan runs {parts}, the model {exact_parts(model)}: build the plan for the model "
            "(ForwardPlan.rollout / ForwardPlan.trainer)"
        )
    if parts.attention and plan.causal_attention:
        raise ValueError("decoder_forward: causal attention rounds unlike the rollout; exact mode refuses it")
    if packed is not None and (kv_cache is not None or bsz != 1 or seq != packed.width):
        raise ValueError(f"decoder_forward: packed rows need one row of {packed.width} tokens and no kv_cache")
    with compute_context(model, input_ids.device, plan.compute_dtype):
        x = backbone.embed_tokens(input_ids)  # [B, S, H]
        cos_sin = backbone.rotary_emb(x, position_ids)  # 2 x [B, S, D]
        causal = plan.causal_attention and kv_cache is None
        right_padded = inputs.right_padded
        causal = causal and (_right_padded(attention_mask) if right_padded is None else right_padded)
        key_valid = attention_mask.bool() if parts.attention else None  # [B, S_total]
        # packed rows attend by their segments (never a dense mask: [T, T] over a packed micro-batch is ~T^2 bytes,
        # 18 GB at 135K tokens); causal and exact attention need none either
        mask = packed if packed is not None else None
        if mask is None and not (causal or parts.attention):
            mask = _attention_mask(attention_mask, seq, cache_start)  # [B, 1, S, S_k]
        triton_ok = fused_ops is not None and fused_ops.fused_ops_supported(x)
        if parts.any and x.is_cuda and triton_ok and not (plan.fused or plan.fused_train):
            raise ValueError(
                "decoder_forward: the exact mode on CUDA runs the per-row fused glue kernels on both sides "
                "(fused=True for the rollout, fused_train=True for the trainer)"
            )
        grouped = plan.fused and triton_ok  # also: the norm kernels write the next FP8 linears' input quantized
        glue = (fused_ops if plan.fused else fused_train_ops if plan.fused_train else None) if triton_ok else None
        if parts.any and glue is not None:
            _check_glue_norms(model)
        shared = _LayerInputs(cos_sin, mask, kv_cache, cache_start, plan.compute_dtype, glue, grouped, key_valid)
        recompute = recomputes(plan.activation_checkpointing, kv_cache)
        delta = None  # the residual branch output not yet added into x (fused: added inside the next norm)
        for layer_idx, layer in enumerate(backbone.layers):
            run = functools.partial(_decoder_layer, shared, layer_idx, layer)
            if recompute:  # a transient FP8 weight lives while its layer runs (precision/convert.py)
                # the residual sum is made before the checkpoint, which then keeps one [B, S, H] tensor, not two
                x, delta = residual_sum(x, delta), None
                release = functools.partial(release_fp8_weights, layer)
                x, delta = checkpoint_layer(run, x, delta, plan.attn_hook, release)
            else:
                x, delta = run(x, delta, plan.attn_hook)
        return _add_norm(x, delta, backbone.norm, glue)[1]  # [B, S, H]


def unfused_norms(model: nn.Module) -> list[str]:
    """The class names of the decoder's norms that the per-row glue kernels do not reproduce: the exact mode and the
    matched kernels cannot take them (torch's own mean rounds by the batch's shape on CUDA, so a decode step and the
    trainer's forward would differ in the last bit)."""
    backbone = _backbone(model)
    names = ("input_layernorm", "post_attention_layernorm")
    attn_norms = [getattr(layer.self_attn, n, None) for layer in backbone.layers for n in ("q_norm", "k_norm")]
    norms = [backbone.norm, *(getattr(layer, n) for layer in backbone.layers for n in names), *attn_norms]
    return sorted({type(n).__name__ for n in norms if n is not None and not fused_ops.fusable_rms_norm(n)})


def _check_glue_norms(model: nn.Module) -> None:
    """Exact mode / matched kernels on the glue path: refuse a norm without a batch-invariant kernel, by name."""
    odd = unfused_norms(model)
    if odd:
        raise ValueError(
            f"decoder_forward: the exact mode has no batch-invariant kernel for {odd} (known: "
            f"{sorted(fused_ops.RMS_NORM_CLASSES)}); add the class to models/fused_ops.RMS_NORM_CLASSES if its math "
            "is HF's Llama/Qwen RMSNorm, or run without policy.generation.deterministic / matched_kernels"
        )


def _check_shapes(
    input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor, inputs: ForwardInputs
) -> tuple[int, int]:
    """(B, S) of input_ids [B, S], checked against position_ids [B, S] and attention_mask [B, S_total]."""
    if input_ids.dim() != 2 or position_ids.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and position_ids must both be [B, S]; got {tuple(input_ids.shape)} and "
            f"{tuple(position_ids.shape)}"
        )
    bsz, seq = input_ids.shape
    kv_cache, cache_start = inputs.kv_cache, inputs.cache_start
    if kv_cache is None:
        if not (isinstance(cache_start, int) and cache_start == 0):
            raise ValueError("cache_start must be 0 without a kv_cache")
        expected = seq
    elif isinstance(cache_start, torch.Tensor):
        expected = kv_cache.max_seq_len
    else:
        expected = cache_start + seq
    if attention_mask.shape != (bsz, expected):
        raise ValueError(f"attention_mask must be [B={bsz}, S_total={expected}], got {tuple(attention_mask.shape)}")
    return bsz, seq


@dataclass(frozen=True)
class _LayerInputs:
    """What every decoder layer of one forward reads besides its own modules, x and delta."""

    cos_sin: tuple[torch.Tensor, torch.Tensor]  # 2 x [B, S, D]
    mask: torch.Tensor | PackedRows | None
    kv_cache: DecoderCache | None
    cache_start: int | torch.Tensor
    compute_dtype: torch.dtype | None
    glue: object  # fused_ops | fused_train_ops | None
    grouped: bool  # one GEMM over sibling linears; the norms and SiLU * up write the next linears' FP8 input
    key_valid: torch.Tensor | None


def _decoder_layer(
    shared: _LayerInputs,
    layer_idx: int,
    layer: nn.Module,
    x: torch.Tensor,
    delta: torch.Tensor | None,
    attn_hook: AttnHook | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer: (x, delta) -> (x + delta + attention, the MLP's output), x / delta / outputs [B, S, H]."""
    s, attn, mlp = shared, layer.self_attn, layer.mlp
    qkv = (attn.q_proj, attn.k_proj, attn.v_proj) if s.grouped else ()
    x, h = _add_norm(x, delta, layer.input_layernorm, s.glue, qkv)
    attn_out = _self_attention(
        attn, layer_idx, h, s.cos_sin, s.mask, s.kv_cache, s.cache_start, attn_hook, s.compute_dtype, s.glue,
        s.grouped, s.key_valid,
    )  # fmt: skip
    gate_up = (mlp.gate_proj, mlp.up_proj) if s.grouped and hasattr(mlp, "gate_proj") else ()
    x, h = _add_norm(x, attn_out, layer.post_attention_layernorm, s.glue, gate_up)
    return x, _mlp(mlp, h, s.glue, s.grouped)
