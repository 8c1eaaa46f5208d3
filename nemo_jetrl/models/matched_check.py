"""The start-up self-check behind `policy.generation.matched_kernels: auto`: is every kernel on the path from a token
to its logprob row-invariant on this device, at this model's shapes?

`matched_kernels` is bitwise on-policy only because each product gives a row the same bits whether it is computed
alone, in a decode batch, in a prefill or in a trainer micro-batch. The attention and the log-sum-exp are
batch-invariant by construction (`batch_invariant_attention`, one program per row); the GEMMs are whatever this
device's library runs (cuBLAS's blockwise FP8 kernel on a Hopper GPU, over at least `gemm.PADDED_MIN_ROWS` rows; the
emulation's float32 matmul on a CPU), and
their row invariance is a measured property that another GPU, library version or shape may not have. The check
measures it on the model it will run, with the model's own modules and the kernels the two sides call:

- each distinct product of the decoder (the q/k/v and gate/up projections as the rollout runs them: one GEMM
  over the group's shared FP8 buffer on CUDA; o, down; the lm_head): random activations [R, K], the trainer's
  forward over all R rows (no grad and with grad), and the rollout's and the trainer's over the first m rows
  for each m in CHECK_ROWS; every row must come out bitwise equal (R = REFERENCE_ROWS, fewer where the output
  would pass OUTPUT_ELEMENTS);
- the attention at the model's heads: a query's output in the trainer's forward (padded rows and packed rows),
  the prefill and single decode steps, bitwise (over an FP8 cache too where the KV cache is FP8);
- the token logprob (the path the model's switch selects) of one row alone and inside a batch.

A product is compared with `Product` objects (name, input width, the two sides' forwards), so a test can hand the
check a GEMM of its own. The first difference found is returned as one line; None means every comparison held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from nemo_jetrl.models.batch_invariant import exact_parts
from nemo_jetrl.models.decoder import compute_context, fused_ops, unfused_norms
from nemo_jetrl.models.logprobs import token_logprobs
from nemo_jetrl.precision.kv import kv_dequant, kv_quant
from nemo_jetrl.precision.linear import rollout_mode
from nemo_jetrl.precision.weight_group import project_shared_input

CHECK_ROWS = (1, 3, 8, 61, 512)  # the rows of the smaller products compared with the reference product's
REFERENCE_ROWS = 4096  # rows of the reference product (a trainer micro-batch's tokens)
OUTPUT_ELEMENTS = 1 << 26  # at most this many outputs per reference product (the lm_head takes fewer rows)
ATTENTION_SHAPE = (3, 150, 40)  # rows, columns (three 64-key blocks), prefill columns of the attention check


@dataclass(frozen=True)
class Product:
    """One product the check compares: x [m, in_features] -> the outputs [m, N_i] (N_i summing to out_features)
    of the rollout's and the trainer's forwards."""

    name: str
    in_features: int
    out_features: int  # summed over the outputs
    rollout: Callable[[torch.Tensor], Sequence[torch.Tensor]]
    trainer: Callable[[torch.Tensor], Sequence[torch.Tensor]]


def row_invariance_problem(product: Product, x: torch.Tensor, rows: Sequence[int] = CHECK_ROWS) -> str | None:
    """None when the trainer's forward over all of x [R, K] (no grad and with grad) and both sides' forwards over
    its first m rows (m in `rows`, m <= R) give every row the same bits; else a line naming the first difference."""
    with torch.no_grad():
        reference = [y.detach() for y in product.trainer(x)]
    with torch.enable_grad():
        graded = [y.detach() for y in product.trainer(x)]
    if not all(torch.equal(a, b) for a, b in zip(graded, reference)):
        return f"{product.name}: the trainer's forward with and without gradient differ"
    for m in (m for m in rows if m <= x.shape[0]):
        for side in ("rollout", "trainer"):
            with torch.no_grad():
                outs = getattr(product, side)(x[:m])
            for out, ref in zip(outs, reference):
                if not torch.equal(out, ref[:m]):
                    return (
                        f"{product.name}: the {side}'s rows of a {m}-row product differ from the same rows in "
                        f"{x.shape[0]} rows"
                    )
    return None


def model_products(model: nn.Module, compute_dtype: torch.dtype | None) -> list[Product]:
    """The model's distinct products as `decoder_forward` runs them on each side (one per kind and shape)."""
    device = next(model.parameters()).device
    grouped = device.type == "cuda"  # the rollout's fast path runs sibling FP8 projections as one GEMM
    seen, products = set(), []

    def add(name: str, linears: tuple[nn.Module, ...]) -> None:
        key = tuple((type(m).__name__, m.in_features, m.out_features, getattr(m, "train_fp8", None)) for m in linears)
        if key in seen:
            return
        seen.add(key)

        def rollout(x):
            with rollout_mode(model), compute_context(model, device, compute_dtype):
                return project_shared_input(x, linears, grouped=grouped)

        def trainer(x):
            with compute_context(model, device, compute_dtype):
                return project_shared_input(x, linears, grouped=False)

        products.append(Product(name, linears[0].in_features, sum(m.out_features for m in linears), rollout, trainer))

    for idx, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        add(f"layers.{idx}.self_attn.q/k/v_proj", (attn.q_proj, attn.k_proj, attn.v_proj))
        add(f"layers.{idx}.self_attn.o_proj", (attn.o_proj,))
        if all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            add(f"layers.{idx}.mlp.gate/up_proj", (mlp.gate_proj, mlp.up_proj))
            add(f"layers.{idx}.mlp.down_proj", (mlp.down_proj,))
    add("lm_head", (model.lm_head,))
    return products


def matched_kernels_problem(
    model: nn.Module, compute_dtype: torch.dtype | None, kv_fp8: bool = False, seed: int = 0
) -> str | None:
    """The self-check (module docstring) on `model` as it is switched now; None when every comparison held."""
    param = next(model.parameters())
    odd = unfused_norms(model) if param.is_cuda and fused_ops is not None else []
    if odd:  # the glue path would run torch's own norm, whose rounding follows the batch's shape
        return f"no batch-invariant kernel for the norms {odd}"
    dtype = compute_dtype or param.dtype
    gen = torch.Generator(device=param.device).manual_seed(seed)
    for product in model_products(model, compute_dtype):
        rows = max(max(CHECK_ROWS), min(REFERENCE_ROWS, OUTPUT_ELEMENTS // product.out_features))
        x = torch.randn(rows, product.in_features, generator=gen, device=param.device).to(dtype)
        problem = row_invariance_problem(product, x)
        if problem is not None:
            return problem
    return attention_problem(model, dtype, kv_fp8, gen) or logprob_problem(model, dtype, gen)


def attention_problem(model: nn.Module, dtype: torch.dtype, kv_fp8: bool, gen: torch.Generator) -> str | None:
    """None when the batch-invariant attention gives a query the same bits in the trainer's padded and packed
    forwards, the prefill and a decode step (over an e4m3 cache with `kv_fp8`), at the model's heads."""
    from nemo_jetrl.models.batch_invariant_attention import attention
    from nemo_jetrl.models.batch_invariant_train import causal_attention, packed_attention
    from nemo_jetrl.models.packed import PackedRows

    cfg, device = model.config, next(model.parameters()).device
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    bsz, seq, prompt = ATTENTION_SHAPE
    q = torch.randn(bsz, heads, seq, dim, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(bsz, kv_heads, seq, dim, generator=gen, device=device).to(dtype) for _ in range(2))
    valid = torch.ones(bsz, seq, dtype=torch.bool, device=device)
    valid[0, :9], valid[1, :70], valid[2, seq - 7 :] = False, False, False  # left pads, right pads
    scales = (None, None)
    k_cache, v_cache = k, v
    if kv_fp8:  # the cache holds e4m3 codes; the trainer reads their fake-quantized values
        scales = tuple(t.abs().amax().float() / 448 for t in (k, v))
        k_cache, v_cache = kv_quant(k, scales[0]), kv_quant(v, scales[1])
        k, v = kv_dequant(k_cache, scales[0], dtype), kv_dequant(v_cache, scales[1], dtype)
    scale = dim**-0.5
    with torch.no_grad():
        train = causal_attention(q, k, v, valid, scale)  # [B, H, S, D]
        real = valid[:, None, :, None].expand_as(q)
        prefill = attention(q[:, :, :prompt], k_cache[:, :, :prompt], v_cache[:, :, :prompt], valid[:, :prompt], 0,
                            scale, *scales)  # fmt: skip
        if not torch.equal(prefill[real[:, :, :prompt]], train[:, :, :prompt][real[:, :, :prompt]]):
            return "attention: the prefill's queries differ from the trainer's"
        for col in (prompt, 64, 127, seq - 8):
            key_valid = valid.clone()
            key_valid[:, col + 1 :] = False
            step = attention(q[:, :, col : col + 1], k_cache, v_cache, key_valid, col, scale, *scales)
            if not torch.equal(step[valid[:, col], :, 0], train[valid[:, col], :, col]):
                return f"attention: a decode step at column {col} differs from the trainer's query"
        packing = PackedRows.from_mask(valid.long(), 64).to(device)
        rows = [t.transpose(1, 2).reshape(bsz * seq, t.shape[1], dim) for t in (q, k, v)]  # [B * S, H(_kv), D]
        pad = [torch.cat([r, r.new_zeros(1, *r.shape[1:])]) for r in rows]  # the rounding slots read a zero row
        packed = [p[packing.index].transpose(0, 1)[None] for p in pad]  # [1, H(_kv), T, D]
        out = packed_attention(*packed, packing, scale)[0].transpose(0, 1)  # [T, H, D]
        padded = train.transpose(1, 2).reshape(bsz * seq, heads, dim)[valid.flatten()]
        if not torch.equal(out[packing.real()[0]], padded):
            return "attention: the packed rows' queries differ from the padded rows'"
    return None


def logprob_problem(model: nn.Module, dtype: torch.dtype, gen: torch.Generator) -> str | None:
    """None when the token logprob both sides compute (`models.logprobs.token_logprobs` as the model's switch
    selects it) gives a row of `dtype` logits alone the bits it gets inside a batch."""
    vocab, device = int(model.config.vocab_size), next(model.parameters()).device
    logits = (torch.randn(8, vocab, generator=gen, device=device) * 4).to(dtype)  # [8, V]
    tokens = torch.randint(0, vocab, (8,), generator=gen, device=device)
    exact = exact_parts(model).logsumexp
    with torch.no_grad():
        batch = token_logprobs(logits, tokens, 1.0, batch_invariant=exact)
        alone = token_logprobs(logits[3:4], tokens[3:4], 1.0, batch_invariant=exact)
    if torch.equal(batch[3:4], alone):
        return None
    return "logprob: a row alone differs from the same row in a batch of 8"
