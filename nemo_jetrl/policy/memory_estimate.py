"""The device memory a GRPO step takes, from the model shape and the `policy` section (no tensor is made).

Each phase's peak is the resident state plus what the phase adds:

- resident: master weights, their gradients (the eager trainers free them at each refit, so only training holds
  them), AdamW's two moments (all in `master_dtype`), the FP8 weight caches (1 byte per FP8 weight, 2 with
  `cache_dgrad_weight`), a reference copy (KL penalty), the BF16 weight copies autocast makes of an FP32 master
  (kept for the backward); the captured micro-batches' pool (`train_cuda_graphs`) is the preflight's to add;
- training: per micro-batch token, what the forward keeps for the backward (below), the backward's working set (one
  layer's activations; under activation checkpointing the recomputed layer's gate / up gradients), the logits (all
  of them, or one chunk under activation checkpointing), and vocabulary-sized gradient transients. Every gradient is
  counted: from a step's second micro-batch on they are all alive when its backward starts (a step of one
  micro-batch peaks lower by them, the decoder's gradients being made as its layers' inputs are freed);
- logprobs (no grad): what one layer holds at once in its forward (`logprob_layer_bytes`) and a logits chunk;
- rollout: the KV cache (the whole batch at its caps, or the `gpu_memory_utilization` pool) and sampling buffers.

One rank of D data-parallel ranks (FSDP2, `policy/parallel/sharding.py` plan "fsdp"): the master weights, their
gradients and AdamW's moments are 1/D each; the rank adds a rollout replica (FP8 bits + scales of the FP8-rollout
linears, the rest in the master dtype), the FSDP2 root unit (embeddings, lm_head, norms) unsharded through the forward
and backward with its unsharded gradients, and a few decoder linears in flight (all-gathered weight, its gradient
and the reduce-scatter's copy). A micro-batch keeps what it keeps in one process: the same token budget costs a rank
the same activations (test_a_rank_holds_no_more_per_micro_batch_than_the_one_process, test_fsdp_gloo.py).

What one decoder layer keeps per token for its backward (`layer_bytes`), on the trainer's CUDA path (fused glue
kernels, grouped FP8 GEMMs): the two norms' residual inputs (FP32 with an FP32 master under autocast), each linear's
input (BF16: the activation, one autocast copy per linear when it is FP32; FP8: its 1-byte WGrad copy X^T and
scales), q / k before their norm (kept as compact copies, also where they are the grouped q/k/v output's views), attention's q, k, v (repeated
to the query heads where the kernel takes no grouped K/V), output and log-sum-exp, gate / up, and the padded path's
additive mask (2 bytes per key per layer). With activation checkpointing a layer keeps its input, the residual sum
made before it (one [T, H] tensor in the residual's dtype), and one layer's activations live at a time, during its
recomputation. docs/long_responses.md compares the estimate with
measured peaks.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_jetrl.config.typed import typed_section

GIB = 1024**3
LOGPROB_CHUNK_ELEMENTS = 1 << 26  # models/logits.py's chunk bound (logits elements)
SAMPLING_ROWS_BYTES = 3 * 8  # per row and vocabulary entry: the rollout's sampling buffers [B, V] (scheduler.py)


@dataclass(frozen=True)
class ModelShape:
    """A Llama / Qwen2 / Qwen3 / Qwen3-MoE decoder's sizes (HF config names in `from_config`); an MoE's every layer
    holds `experts` experts of `moe_intermediate`, `experts_per_token` of them run per token."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any) -> ModelShape:
        """From a HF config.json dict or a `PretrainedConfig`."""
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        heads = int(get("num_attention_heads"))
        hidden = int(get("hidden_size"))
        experts = int(get("num_experts") or get("num_local_experts") or 0)  # config.json of transformers >= 5: the latter
        return cls(
            vocab=int(get("vocab_size")), hidden=hidden, layers=int(get("num_hidden_layers")),
            intermediate=int(get("intermediate_size")), heads=heads, kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or hidden // heads), tied=bool(get("tie_word_embeddings", False)),
            experts=experts, experts_per_token=int(get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate=int(get("moe_intermediate_size") or 0) if experts else 0,
        )  # fmt: skip

    @property
    def ffn_rows(self) -> int:
        """Rows the FFN runs per token: the k experts' copies of it (MoE), else 1."""
        return self.experts_per_token if self.experts else 1

    @property
    def ffn_intermediate(self) -> int:
        """The FFN's intermediate width per row (one expert's for an MoE)."""
        return self.moe_intermediate if self.experts else self.intermediate

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_linear_params(self) -> int:
        """q, k, v, o, gate, up, down of one decoder layer (every expert's, and the router, of an MoE)."""
        h, f = self.hidden, self.ffn_intermediate
        ffn = self.experts * (3 * h * f + h) if self.experts else 3 * h * f
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + ffn

    def params(self) -> int:
        """Every parameter (norm weights included)."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        norms = self.layers * (2 * self.hidden + 2 * self.head_dim) + self.hidden
        return embeddings + self.layers * self.layer_linear_params() + norms


@dataclass(frozen=True)
class TrainerMemorySettings:
    """What of the `policy` section sizes the memory (`from_policy`)."""

    master_bytes: int  # 4 (float32) | 2 (bfloat16)
    fp8_train: bool
    fp8_weights: bool  # FP8 weight caches exist (trainer or rollout FP8)
    bf16_layers: tuple[int, int]  # num_first_layers_in_bf16, num_last_layers_in_bf16
    dgrad_cache: bool
    kv_bytes: int  # per cached K/V element: 1 (fp8) | 2
    checkpointing: bool
    packed: bool
    width: int  # policy.max_total_sequence_length
    reference: bool  # a frozen reference copy (KL penalty)
    graphs: bool  # train_cuda_graphs: gradients kept between steps, one micro-batch's activations reserved
    transient_fp8: bool = False  # fp8_cfg.transient_train_weights

    @classmethod
    def from_policy(cls, policy: Any, reference: bool = False, cuda: bool = True) -> TrainerMemorySettings:
        """From a `PolicyConfig`. `cuda`: the trainer runs on a CUDA device (where `train_cuda_graphs: auto` may
        capture: policy/auto_switches.py)."""
        policy = typed_section(policy, "PolicyConfig", "TrainerMemorySettings.from_policy")
        fp8, gen = policy.fp8_cfg, policy.generation
        graphs = policy.train_cuda_graphs
        if graphs == "auto":
            from nemo_jetrl.policy.auto_switches import train_graphs_auto_blocker

            graphs = train_graphs_auto_blocker(policy, "cuda" if cuda else "cpu") is None
        return cls(
            master_bytes=4 if policy.master_dtype == "float32" else 2, fp8_train=policy.precision == "fp8",
            fp8_weights=policy.precision == "fp8" or gen.precision == "fp8",
            bf16_layers=(fp8.num_first_layers_in_bf16, fp8.num_last_layers_in_bf16),
            dgrad_cache=fp8.cache_dgrad_weight, kv_bytes=1 if gen.kv_cache_dtype == "fp8" else 2,
            checkpointing=policy.dtensor_cfg.activation_checkpointing,
            packed=policy.sequence_packing.enabled, width=policy.max_total_sequence_length,
            reference=reference, graphs=bool(graphs), transient_fp8=fp8.transient_train_weights,
        )  # fmt: skip

    def fp8_layer(self, shape: ModelShape, layer: int) -> bool:
        """Whether decoder layer `layer`'s linears hold FP8 weights (the one layer map's BF16 first / last)."""
        first, last = self.bf16_layers
        return self.fp8_weights and first <= layer < shape.layers - last


def varlen_takes_grouped_kv() -> bool:
    """Whether torch's flash varlen kernel reads grouped K/V in place (`enable_gqa`); else they are repeated."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - no varlen API: the twin repeats K/V
        return False
    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def layer_bytes(shape: ModelShape, s: TrainerMemorySettings, fp8: bool, grouped_kv: bool = False) -> float:
    """Bytes per token one decoder layer keeps for its backward (module docstring); `fp8`: its linears train in
    FP8; `grouped_kv`: the packed path's flash kernel reads grouped K/V in place. An MoE's FFN keeps its k rows per
    token: the experts' inputs (one more copy of the normed input per row) and intermediates."""
    h, q, kv, rows = shape.hidden, shape.q_dim, shape.kv_dim, shape.ffn_rows
    f = rows * shape.ffn_intermediate  # the FFN's intermediate values per token
    moe_inputs = (rows if shape.experts else 0) * h  # the experts' gathered input rows
    res = 4 if s.master_bytes == 4 else 2  # the residual stream (FP32 under autocast with an FP32 master)
    kept = 2 * res * h  # the two norms' residual inputs
    attn_kv = 2 * kv if grouped_kv and s.packed else 2 * q  # K, V as attention keeps them
    kept += 2 * q + 2 * attn_kv + 2 * q + 4 * shape.heads  # q, k, v, out (= o_proj's BF16 input), lse
    if not s.packed:
        kept += 2 * s.width  # the padded path's additive mask [B, 1, S, S] in bf16, made per layer
    if fp8:
        kept += (1 + 1 / 32) * (2 * h + q + f + moe_inputs)  # e4m3 X^T + fp32 scales per 128 tokens: q/k/v,
        kept += 2 * (q + kv)  # gate/up, o, down; q / k before their norm (compact copies of the grouped output's)
    else:
        copies = 5 if s.master_bytes == 4 else 2  # FP32 normed inputs: one BF16 copy per linear (q, k, v, gate, up)
        kept += 2 * h * copies + 2 * (q + kv) + 2 * f + 2 * moe_inputs  # those inputs, q / k before their norm,
        # down's input, the experts' gathered input
    return kept + 4 * f  # gate and up (SiLU*up's inputs)


def logprob_layer_bytes(shape: ModelShape, s: TrainerMemorySettings, grouped_kv: bool = False) -> float:
    """Bytes per token one decoder layer holds at once in a no-grad forward (the logprob, reference and calibration
    passes; nothing is kept for a backward): the residual stream and its delta (FP32 under autocast with an FP32
    master), four hidden-sized BF16 buffers (the normed input, the attention / FFN output, the next norm's two
    outputs), and the larger of the FFN's working set (gate, up and SiLU*up; an MoE's gathered input rows and their
    outputs) and attention's (q/k/v, its output, K/V repeated where the kernel takes no grouped K/V); the padded
    path's additive mask, one at a time. Measured against an H200's allocator trace: docs/long_responses.md."""
    h, q, kv, f = shape.hidden, shape.q_dim, shape.kv_dim, shape.ffn_rows * shape.ffn_intermediate
    res = 4 if s.master_bytes == 4 else 2
    moe_rows = 2 * 2 * shape.ffn_rows * h if shape.experts else 0  # gathered inputs + expert outputs
    ffn = 3 * 2 * f + moe_rows
    repeated = 0 if grouped_kv and s.packed else 2 * 2 * q
    attention = 2 * (q + 2 * kv) + 2 * q + repeated
    mask = 0 if s.packed else 2 * s.width
    return 2 * res * h + 4 * 2 * h + max(ffn, attention) + mask


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes by part and per micro-batch token; each phase's peak at a micro-batch's tokens."""

    resident: dict[str, int]  # held through the step (gradients: through training only, unless captured)
    train_per_token: float  # what the forward keeps + the backward's working set, per micro-batch token
    train_fixed: int  # per training micro-batch besides its tokens (logits chunk, vocabulary-sized gradients)
    logprob_per_token: float
    logprob_fixed: int
    rollout_kv: int  # the KV cache and sampling buffers
    layer_bytes: int  # one decoder layer's activations per token (the largest)
    grads_kept: bool  # gradients stay allocated between steps (captured micro-batches)
    train_released: int = 0  # resident bytes the training pass does not hold (transient FP8 weights, less a layer's)

    def resident_total(self, phase: str = "train") -> int:
        total = sum(self.resident.values())
        if phase == "train":
            return total - self.train_released
        return total if self.grads_kept else total - self.resident["gradients"]

    def peak(self, phase: str, tokens: int = 0) -> int:
        """Peak bytes of phase "train" | "logprob" (a micro-batch of `tokens`) | "rollout"."""
        if phase == "rollout":
            return self.resident_total(phase) + self.rollout_kv
        per, fixed = (self.train_per_token, self.train_fixed) if phase == "train" else (
            self.logprob_per_token, self.logprob_fixed)  # fmt: skip
        return self.resident_total(phase) + fixed + int(per * tokens)

    def tokens_within(self, limit: int, phase: str) -> int:
        """The most micro-batch tokens of a "train" | "logprob" pass whose peak stays within `limit` bytes."""
        per = self.train_per_token if phase == "train" else self.logprob_per_token
        return max(0, int((limit - self.peak(phase)) // per))


def estimate(
    shape: ModelShape, s: TrainerMemorySettings, rollout_kv_bytes: int, rollout_rows: int, ranks: int = 1
) -> MemoryEstimate:
    """The step's memory at this shape and these settings; `rollout_kv_bytes`: the rollout's KV cache (the batch
    at its caps, or the pool a KV budget sizes, `kv_cache_bytes`), `rollout_rows`: sequences decoded at once;
    `ranks`: the data-parallel ranks of an FSDP2 trainer, the estimate then one rank's (module docstring)."""
    p, m, v, h = shape.params(), s.master_bytes, shape.vocab, shape.hidden
    fp8_layers = [s.fp8_layer(shape, i) for i in range(shape.layers)]
    fp8_params = sum(fp8_layers) * shape.layer_linear_params()
    fp8_bytes = fp8_weight_bytes(fp8_params)
    if ranks > 1:
        resident = _rank_resident(shape, s, ranks, fp8_params, fp8_bytes)
    else:
        resident = {"weights": p * m, "gradients": p * m, "adam": 2 * p * m}
        if fp8_params:
            resident["fp8_weights"] = fp8_bytes * (2 if s.dgrad_cache else 1)
    if s.reference:
        resident["reference"] = p * m
    if m == 4:  # autocast's BF16 copies of FP32 weights, alive to the end of each forward: BF16 linears, lm_head
        bf16_linears = shape.layers * shape.layer_linear_params() - (fp8_params if s.fp8_train else 0)
        resident["bf16_weight_copies"] = 2 * (bf16_linears + v * h)
    grouped_kv = varlen_takes_grouped_kv()
    kept = [layer_bytes(shape, s, s.fp8_train and fp8, grouped_kv) for fp8 in fp8_layers]
    res, one_layer, chunk = (4 if m == 4 else 2), max(kept), _chunk_tokens(shape, s)
    if s.checkpointing:  # each layer's residual input; one layer's activations at a time; one logits chunk at a time
        per_token = shape.layers * res * h + one_layer
        logits = 2 * 2 * chunk * v  # the recomputed chunk and its gradient
    else:
        per_token = sum(kept) + 2 * v  # + every logit
        logits = 2 * chunk * v  # one chunk's gradient
    # the backward's working set: checkpointed, the recomputed layer's gate / up gradients (what the 8B 16K trace
    # had alive beside that layer's activations); else one layer's activations (the 1.7B 8K runs: within 5%)
    backward = 2 * 2 * shape.ffn_rows * shape.ffn_intermediate if s.checkpointing else one_layer
    per_token += (res + 2) * h + backward  # + the final norm's input and output
    vocab_grads = (2 + 4) * v * h  # lm_head's BF16 weight gradient and its FP32 accumulation
    return MemoryEstimate(
        resident=resident, train_per_token=per_token, train_fixed=logits + vocab_grads,
        logprob_per_token=logprob_layer_bytes(shape, s, grouped_kv), logprob_fixed=2 * chunk * v,
        rollout_kv=rollout_kv_bytes + rollout_rows * v * SAMPLING_ROWS_BYTES, layer_bytes=int(one_layer),
        grads_kept=s.graphs, train_released=_transient_fp8_bytes(shape, s, resident, ranks),
    )  # fmt: skip


def _transient_fp8_bytes(shape: ModelShape, s: TrainerMemorySettings, resident: dict, ranks: int) -> int:
    """What the training pass does not hold of the FP8 weight cache when its linears are transient (eager,
    checkpointed FP8 training in one process, `fp8_cfg.transient_train_weights`): all of it but two
    layers' (the recomputed layer's, kept for its backward, and the one the recomputation quantizes next)."""
    transient = s.transient_fp8 and s.fp8_train and s.checkpointing and not s.graphs and ranks == 1
    if not transient or "fp8_weights" not in resident:
        return 0
    return max(0, resident["fp8_weights"] - 2 * fp8_weight_bytes(shape.layer_linear_params()))


def fp8_weight_bytes(params: int) -> int:
    """FP8 weight bytes of `params` weights: the e4m3 bits and an fp32 scale per 128x128 tile."""
    return int(params * (1 + 4 / 128**2))


def _rank_resident(shape: ModelShape, s: TrainerMemorySettings, ranks: int, fp8_params: int, fp8_bytes: int) -> dict:
    """What one of `ranks` FSDP2 ranks holds through the step (module docstring); "gradients" (training only)
    takes the root unit's unsharded gradients and the linears' in flight too."""
    p, m = shape.params(), s.master_bytes
    shard = -(-p * m // ranks)  # FSDP2 pads each parameter to D equal chunks: at most a row more per parameter
    root = p - shape.layers * shape.layer_linear_params()  # embeddings, lm_head, norms: the FSDP2 root unit
    h, f = shape.hidden, shape.ffn_intermediate
    largest_linear = max(h * f, h * shape.q_dim)  # gate / up / down (one expert's), or q / o
    in_flight = 2 * largest_linear * m  # the unit all-gathered now and the one prefetched
    resident = {
        "weights": shard, "gradients": shard + root * m + 2 * in_flight, "adam": 2 * shard,
        "fsdp_unsharded": root * m + in_flight,
        "rollout_replica": fp8_bytes + (p - fp8_params) * m,  # FP8 bits + scales; the rest in the master dtype
    }  # fmt: skip
    if fp8_params and s.dgrad_cache:  # the DGrad layout's second FP8 copy (the forward bits are the replica's)
        resident["fp8_weights"] = fp8_bytes
    return resident


def kv_cache_bytes(shape: ModelShape, s: TrainerMemorySettings, tokens: int) -> int:
    """KV cache bytes of `tokens` cached tokens (K and V, every layer)."""
    return tokens * 2 * shape.layers * shape.kv_dim * s.kv_bytes


def _chunk_tokens(shape: ModelShape, s: TrainerMemorySettings) -> int:
    """Tokens of one logits chunk (models/scoring.py): packed rows by tokens, padded ones by whole rows."""
    if s.packed:
        return max(1, LOGPROB_CHUNK_ELEMENTS // shape.vocab)
    rows = max(1, LOGPROB_CHUNK_ELEMENTS // max(1, (s.width - 1) * shape.vocab))
    return rows * s.width
