"""Native rollout engine: the trainer's own model object, `decoder_forward` with a static KV cache, device sampling.

Colocated by design: the engine holds the trainer's module objects (weights by reference), so after an optimizer
step the rollout sees the new weights (and, in unified FP8, the very FP8 weight bits and scales the trainer cached)
with no copy. Generation runs under `torch.no_grad()` (not inference_mode: the trainer later runs autograd on the
same parameters) and with its FP8 layers in the engine's `linear_mode` (precision's `linear_mode(model, mode)`:
"rollout", or "reference" for a BF16 referee).

CUDA fast path (`cuda_graphs=True` on a CUDA model): static-shape decode over a pre-allocated cache, the step
captured once per rollout in a CUDA graph (`cuda_graph.py`), attention reading the stored (optionally FP8) cache
directly (`decode_attention.py`), sampling on the device, and the host checks for "all finished" only every
`sync_every` steps. Rows that finish early keep decoding pad tokens until then; outputs are trimmed to the longest
response, so the layout is the same as with a check at every step.

Deterministic scoring (`score`): the rollout's own computation replayed with the generated tokens forced, i.e.
the same batch, the same prefill/decode shapes and kernels, so its logprobs equal `generate`'s bit for bit
(gen_kl_error == 0) on any device whose kernels are deterministic for a fixed shape. It checks the engine against
itself; the GRPO loop never takes prev_logprobs from it (they come from the trainer's forward).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput
from nemo_jetrl.generation.native.continuous import ContinuousRollout, RolloutStats, StreamClock, rollout_time_parts
from nemo_jetrl.generation.native.cuda_graph import rollout_decoder
from nemo_jetrl.generation.native.decode_attention import triton_decode_available
from nemo_jetrl.generation.native.kv_cache import KVCache, resolve_kv_cache_dtype
from nemo_jetrl.generation.native.prompts import check_prompts, left_pad, length_caps
from nemo_jetrl.generation.native.sampler import SamplingParams, sample, seed_of, sequence_keys, token_logprobs
from nemo_jetrl.generation.native.scheduler import DEFAULT_BLOCK_SIZE, engine_kv_budget
from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import AttnHook, ForwardInputs, ForwardPlan
from nemo_jetrl.models.logits import compute_logits
from nemo_jetrl.models.moe import decode_syncs_host
from nemo_jetrl.models.moe_routing import RoutingRecord, observing
from nemo_jetrl.precision import linear_mode as with_linear_mode
from nemo_jetrl.utils.device_memory import release_cached_memory


class NativeGenerationEngine(GenerationInterface):
    """Batched prefill + decode over `model` (a HF Llama/Qwen2/Qwen3 causal LM, possibly FP8-converted).

    attn_hook_factory: called with no arguments at the start of each `generate()`; returns the `attn_hook` for that
    rollout (e.g. FP8 Q quantization with the current calibration) or None.
    static_decode: False (default) attends each decode step over the written cache prefix, which on CPU reproduces
    HF `generate` bit for bit in bf16 too; True attends over the whole fixed-size buffer with a mask (static shapes,
    what a CUDA graph captures; same math, last-bit differences in bf16).
    cuda_graphs: on a CUDA model, capture the (static) decode step in a CUDA graph; ignored on CPU.
    fused_decode: decode attention over the stored cache and the fused glue kernels of `decoder_forward` (Triton);
    None = on for CUDA models with triton. A model in the exact mode (`models.batch_invariant`) takes the
    batch-invariant attention and logprobs instead, and keeps the fused glue on CUDA (the trainer runs it too).
    sync_every: host check for "all rows finished" every N decode steps (None = 1 on CPU, 16 on CUDA).

    KV budget and continuous batching (`continuous.py`): max_num_seqs caps the sequences decoded at once;
    kv_cache_memory_bytes (any device) or gpu_memory_utilization (CUDA: that fraction of the memory the process
    does not hold) caps the KV cache; max_model_len caps each row's prompt + response. When the caps cannot hold
    the whole batch at once (or continuous_batching=True), sequences queue for a paged KV pool of kv_block_size-
    token blocks (preempted and recomputed when it runs dry) and take the rows of those that finish; otherwise
    the batch is decoded in one static batch as before.

    linear_mode: "rollout" runs the FP8 layers' rollout forward (the recipe's); "reference" their plain linear on
    the master weights (with kv_cache_dtype None: a BF16 referee of the same weights, `grpo.val_reference`).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        max_new_tokens: int,
        max_total_length: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        compute_dtype: torch.dtype | None = None,
        kv_cache_dtype: str | torch.dtype | None = None,
        attn_hook_factory: Callable[[], AttnHook | None] | None = None,
        device: torch.device | str | None = None,
        static_decode: bool = False,
        cuda_graphs: bool = False,
        fused_decode: bool | None = None,
        sync_every: int | None = None,
        max_num_seqs: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        continuous_batching: bool | None = None,
        kv_block_size: int | None = None,
        linear_mode: str = "rollout",
    ) -> None:
        self._init_kwargs = {k: v for k, v in locals().items() if k not in ("self", "model", "__class__")}
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if pad_token_id is None:
            raise ValueError("pad_token_id must be set (the tokenizer has no pad token?)")
        if sync_every is not None and (isinstance(sync_every, bool) or int(sync_every) < 1):
            raise ValueError(f"sync_every must be None or an int >= 1, got {sync_every!r}")
        self.model = model
        self.max_new_tokens = int(max_new_tokens)
        self.max_total_length = None if max_total_length is None else int(max_total_length)
        self.sampling = SamplingParams(float(temperature), float(top_p), None if top_k is None else int(top_k))
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.compute_dtype = compute_dtype
        param = next(model.parameters())
        self.device = torch.device(device) if device is not None else param.device
        if self.device.type != param.device.type or (
            self.device.index is not None and param.device.index is not None and self.device.index != param.device.index
        ):
            raise ValueError(
                f"device {self.device} differs from the model's {param.device}: the engine shares the trainer's "
                "modules and does not move them"
            )
        self.kv_cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, compute_dtype or param.dtype)
        self.attn_hook_factory = attn_hook_factory
        on_cuda = self.device.type == "cuda"
        # an MoE whose experts read their row counts on the host cannot be captured: its decode steps run eagerly
        self.cuda_graphs = bool(cuda_graphs) and on_cuda and not decode_syncs_host(model, compute_dtype or param.dtype)
        self.static_decode = bool(static_decode) or self.cuda_graphs
        if fused_decode and not (on_cuda and triton_decode_available()):
            raise ValueError("fused_decode=True needs a CUDA model and triton")
        self.fused_decode = (on_cuda and triton_decode_available()) if fused_decode is None else bool(fused_decode)
        self.forward_plan = ForwardPlan.rollout(model, compute_dtype, fused=self.fused_decode)  # + a rollout's hook
        if self.forward_plan.exact.any and on_cuda and not self.fused_decode:  # the exact parts: the trainer's kernels
            raise ValueError(
                "fused_decode=False with a model in the exact mode: its rollout runs the fused glue kernels the "
                "trainer runs (leave fused_decode unset)"
            )
        self.sync_every = int(sync_every) if sync_every is not None else (16 if on_cuda else 1)
        self.vocab_size = int(model.config.vocab_size)
        self.max_num_seqs = None if max_num_seqs is None else int(max_num_seqs)
        self.kv_cache_memory_bytes = None if kv_cache_memory_bytes is None else int(kv_cache_memory_bytes)
        self.gpu_memory_utilization = None if gpu_memory_utilization is None else float(gpu_memory_utilization)
        if linear_mode not in ("rollout", "reference"):
            raise ValueError(f"linear_mode must be 'rollout' or 'reference', got {linear_mode!r}")
        self.linear_mode = linear_mode
        self.max_model_len = None if max_model_len is None else int(max_model_len)
        if self.max_model_len is not None:  # one total cap per row: the tighter of the two
            self.max_total_length = min(self.max_total_length or self.max_model_len, self.max_model_len)
        self.continuous_batching = continuous_batching
        self.kv_block_size = DEFAULT_BLOCK_SIZE if kv_block_size is None else int(kv_block_size)
        if self.kv_block_size < 1:
            raise ValueError(f"kv_block_size must be >= 1, got {kv_block_size}")
        self.last_rollout_stats: RolloutStats | None = None  # of the last continuous-batching generate
        self.last_rollout_timings: dict[str, float] = {}  # device seconds by part, of the last generate
        self._kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None

    # ------------------------------------------------------------------ GenerationInterface
    def prepare_for_generation(self) -> bool:
        """Nothing to wake: weights are the trainer's, caches are allocated per call."""
        return True

    def finish_generation(self) -> bool:
        """The per-call KV cache and decode graphs are freed when `generate` returns; their cached blocks go back to
        the driver here (CUDA), before the logprob and training passes."""
        release_cached_memory(self.device)
        return True

    def update_weights(
        self,
        weights: Mapping[str, torch.Tensor] | None = None,
        *,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Refit: weights are shared by reference (no copy); only FP8 KV scales (k [L], v [L]) are taken."""
        if weights is not None:
            raise ValueError(
                "NativeGenerationEngine shares the trainer's modules; weights are taken by reference, pass only "
                "kv_scales"
            )
        if kv_scales is not None:
            k_scales, v_scales = kv_scales
            self._kv_scales = (k_scales.detach().float().clone(), v_scales.detach().float().clone())

    def rollout_timings(self) -> dict[str, float]:
        """The last rollout's device seconds by part: `cuda_graph_capture` (with the garbage collection before it
        and the first replay), `decode`, and `prefill` (one static batch) or `admission` (continuous batching:
        prefills, prompt sharing, row compaction)."""
        return dict(self.last_rollout_timings)

    def replace(self, **changes) -> NativeGenerationEngine:
        """A new engine over the same model with some constructor arguments changed (e.g. `kv_cache_dtype=None`
        for a high-precision calibration rollout); KV scales are carried over."""
        engine = NativeGenerationEngine(self.model, **{**self._init_kwargs, **changes})
        engine._kv_scales = self._kv_scales
        return engine

    @property
    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The FP8 KV scales (k [L], v [L]) the next rollout uses, or None."""
        return self._kv_scales

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """Complete each prompt; see GenerationOutput for the layout. max_new_tokens: a per-row response cap
        (within the engine's caps), e.g. a benchmark's drawn response lengths."""
        check_prompts(prompt_ids, self.max_total_length, self.vocab_size)
        caps = length_caps(prompt_ids, self.max_new_tokens, self.max_total_length, max_new_tokens)
        budget = engine_kv_budget(self, prompt_ids, caps)
        if not budget.whole_batch or self.continuous_batching:
            rollout = ContinuousRollout(self, prompt_ids, budget, caps)
            with torch.no_grad(), with_linear_mode(self.model, self.linear_mode):
                out = rollout.run(greedy, generator)
            self.last_rollout_stats, self.last_rollout_timings = rollout.stats, rollout.stats.timings()
            return out
        self.last_rollout_stats = None
        prompt_len, num_steps = max(len(p) for p in prompt_ids), max(caps)
        ids, mask = left_pad(prompt_ids, prompt_len + num_steps, self.pad_token_id, self.device)
        limits = torch.tensor([len(p) + c for p, c in zip(prompt_ids, caps)], device=self.device)  # [B] real tokens
        clock = StreamClock(self.device)
        with torch.no_grad(), with_linear_mode(self.model, self.linear_mode):
            out = self._run(ids, mask, prompt_len, greedy=greedy, generator=generator, limits=limits, clock=clock)
        self.last_rollout_timings = rollout_time_parts(  # _run's last sync followed every mark
            clock.total("rollout"), prefill=clock.total("prefill"), cuda_graph_capture=clock.total("capture")
        )
        return out

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
        """Logprobs [B, S] float32 of a `generate` output's tokens, recomputed by replaying the rollout (same batch,
        shapes and kernels, the generated tokens forced): equal to its `generation_logprobs` bit for bit.

        input_ids / attention_mask: [B, S] in the shared layout, exactly the rows (and order) of one `generate` call
        on this engine, with the responses starting at column `prompt_length`."""
        if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and attention_mask must both be [B, S]; got {tuple(input_ids.shape)} and "
                f"{tuple(attention_mask.shape)}"
            )
        bsz, width = input_ids.shape
        if not 0 < prompt_length < width or width - prompt_length > self.max_new_tokens:
            raise ValueError(
                f"prompt_length {prompt_length} must leave 1..max_new_tokens={self.max_new_tokens} response columns "
                f"in a width of {width}"
            )
        max_len = prompt_length + self.max_new_tokens
        ids = torch.full((bsz, max_len), self.pad_token_id, dtype=torch.long, device=self.device)
        mask = torch.zeros((bsz, max_len), dtype=torch.long, device=self.device)
        ids[:, :width] = input_ids.to(self.device)
        mask[:, :width] = attention_mask.to(self.device).long()
        forced = (ids.clone(), mask.clone())
        mask[:, prompt_length:] = 0
        with torch.no_grad(), with_linear_mode(self.model, self.linear_mode):
            out = self._run(ids, mask, prompt_length, forced=forced, num_steps=width - prompt_length)
        return out.generation_logprobs

    # ------------------------------------------------------------------ one rollout's pieces (for profiling)
    def new_kv_cache(self, batch_size: int, max_seq_len: int) -> KVCache:
        """An empty KV cache of `batch_size` rows x `max_seq_len` tokens, as `generate` allocates it (e4m3 with the
        engine's KV scales when `kv_cache_dtype` is fp8)."""
        return self._new_cache(batch_size, max_seq_len)

    def decoder(self, cache: KVCache, mask: torch.Tensor, attn_hook: AttnHook | None = None) -> Callable:
        """The decode step `generate` runs over `cache` (prefix, static or CUDA-graph form, by the engine's settings):
        `decode(tokens [B], positions [B], col) -> logits [B, V]`, writing cache column `col`; mask: [B, S_max]."""
        return self._decoder(cache, self.forward_plan.with_hook(attn_hook), mask)

    # ------------------------------------------------------------------ internals
    def _new_cache(self, batch_size: int, max_seq_len: int) -> KVCache:
        cache = KVCache.for_model(
            self.model,
            batch_size,
            max_seq_len,
            dtype=self.kv_cache_dtype,
            device=self.device,
            fused_decode=self.fused_decode,
        )
        if cache.is_fp8:
            if self._kv_scales is None:
                raise ValueError("kv_cache_dtype=fp8 needs KV scales: call update_weights(kv_scales=(k, v)) first")
            cache.set_scales(*self._kv_scales)
        return cache

    def _prefill(self, cache: KVCache, plan: ForwardPlan, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Prompts ids/mask [B, P] into the cache; logits [B, V] for the first generated token. plan: the engine's
        with this rollout's attention hook (`forward_plan.with_hook`, once a rollout)."""
        inputs = ForwardInputs.cached(cache, 0)
        hidden = decoder_forward(self.model, ids, position_ids_from_mask(mask), mask, plan, inputs)  # [B, P, H]
        # logits in lm_head's dtype, as the trainer hands them to `token_logprobs` (same kernel, same bits)
        return compute_logits(self.model, hidden[:, -1:], compute_dtype=self.compute_dtype)[:, 0]

    def _decode_step(
        self,
        cache: KVCache,
        plan: ForwardPlan,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache_start: int | torch.Tensor,
    ) -> torch.Tensor:
        """One token per sequence at cache column `cache_start`: tokens/positions [B, 1]. Returns logits [B, V].

        Static form (capturable): `cache_start` a 0-dim long tensor and mask [B, S_max]; prefix form: an int
        `cache_start` and mask [B, cache_start + 1]."""
        inputs = ForwardInputs.cached(cache, cache_start)
        hidden = decoder_forward(self.model, tokens, positions, mask, plan, inputs)  # [B, 1, H]
        return compute_logits(self.model, hidden, compute_dtype=self.compute_dtype)[:, 0]  # [B, V]

    def _decoder(
        self, cache: KVCache, plan: ForwardPlan, mask: torch.Tensor, record: RoutingRecord | None = None
    ) -> Callable:
        """`decode(tokens [B], positions [B], col) -> logits [B, V]` for this rollout: prefix, static or graphed
        (`cuda_graph.rollout_decoder`). An MoE model's `record` takes each step's routing at its column."""
        step = functools.partial(self._decode_step, cache, plan)
        return rollout_decoder(step, mask, record, static=self.static_decode, graphed=self.cuda_graphs)

    def _run(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        prompt_len: int,
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        forced: tuple[torch.Tensor, torch.Tensor] | None = None,
        limits: torch.Tensor | None = None,
        num_steps: int | None = None,
        clock: StreamClock | None = None,
    ) -> GenerationOutput:
        """The rollout loop over ids/mask [B, S_max] (prompts in [0, P)), `num_steps` (default S_max - P) steps at
        most; `limits` [B]: each row's cap on real tokens (prompt + response). With `forced` (ids, mask [B, S_max])
        the tokens are taken from it instead of sampled (`score`), for exactly `num_steps` steps. `clock` takes the
        spans `rollout`, `prefill` and `capture` (the first, capturing decode call of a graphed engine)."""
        batch, max_len = ids.shape
        num_steps = max_len - prompt_len if num_steps is None else num_steps
        cache = self._new_cache(batch, max_len)
        hook = self.attn_hook_factory() if self.attn_hook_factory is not None else None
        record = RoutingRecord.for_model(self.model, batch, max_len, self.device)  # MoE: the experts each token took
        clock = clock if clock is not None else StreamClock(self.device)
        with observing(self.model, record):
            out = self._loop(
                ids, mask, prompt_len, num_steps, cache, hook, record, greedy, generator, forced, limits, clock
            )
        if record is not None:
            out.routed_experts = record.choices[:, : out.input_ids.shape[1]].contiguous()  # [B, S, L, k]
        return out

    def _loop(
        self, ids, mask, prompt_len, num_steps, cache, hook, record, greedy, generator, forced, limits, clock
    ) -> GenerationOutput:
        """`_run`'s prefill and decode steps (its docstring), routing recorded into `record` (an MoE model)."""
        batch = ids.shape[0]
        logprobs = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)  # [B, S_max]
        stop_ids = torch.tensor(self.stop_token_ids, dtype=torch.long, device=self.device)
        pad = torch.full((batch,), self.pad_token_id, dtype=torch.long, device=self.device)
        plan = self.forward_plan.with_hook(hook)  # this rollout's, for the prefill and every decode step
        exact_logsumexp = plan.exact.logsumexp  # the samplers' log-sum-exp: the exact mode's where the plan runs it
        decode = self._decoder(cache, plan, mask, record)
        keys = sequence_keys(seed_of(generator), torch.arange(batch, device=self.device))  # [B] sampling streams

        if record is not None:
            record.start = 0  # the prompt's tokens at columns 0 .. P-1
        with clock.span("rollout"):  # read after the sync below (a sampled rollout)
            with clock.span("prefill"):
                logits = self._prefill(cache, plan, ids[:, :prompt_len], mask[:, :prompt_len])  # [B, V]
            lengths = mask.sum(-1)  # [B] real tokens so far = position of the next token
            finished = torch.zeros(batch, dtype=torch.bool, device=self.device)  # [B]
            steps = 0
            for step in range(num_steps):
                col = prompt_len + step
                if forced is None:
                    tokens, token_logprobs_ = sample(
                        logits, self.sampling, greedy=greedy, keys=keys, counters=step,
                        batch_invariant=exact_logsumexp,
                    )  # [B] each
                    active = ~finished & (lengths < limits)  # rows at their cap stop (truncated, not finished)
                else:
                    tokens, active = forced[0][:, col], forced[1][:, col].bool()
                    token_logprobs_ = token_logprobs(
                        logits, tokens, self.sampling.temperature, batch_invariant=exact_logsumexp
                    )
                tokens = torch.where(active, tokens, pad)
                ids[:, col] = tokens
                mask[:, col] = active.long()
                logprobs[:, col] = torch.where(active, token_logprobs_, torch.zeros_like(token_logprobs_))
                finished = finished | (active & torch.isin(tokens, stop_ids))
                positions = lengths.clone()  # [B]
                lengths = lengths + active.long()
                steps = step + 1
                if steps == num_steps:
                    break
                if forced is None and steps % self.sync_every == 0 and bool((finished | (lengths >= limits)).all()):
                    break
                capturing = steps == 1 and self.cuda_graphs  # the first call captures the step's graph
                with clock.span("capture") if capturing else contextlib.nullcontext():
                    logits = decode(tokens, positions, col)

        response_lengths = mask[:, prompt_len : prompt_len + steps].sum(-1)  # [B]
        width = prompt_len + (int(response_lengths.max()) if forced is None else steps)
        response_mask = torch.zeros_like(mask[:, :width])  # [B, S]
        response_mask[:, prompt_len:] = mask[:, prompt_len:width]
        return GenerationOutput(
            input_ids=ids[:, :width].contiguous(),
            attention_mask=mask[:, :width].contiguous(),
            response_mask=response_mask,
            generation_logprobs=logprobs[:, :width].contiguous(),
            prompt_length=prompt_len,
            response_lengths=response_lengths,
            finished=finished,
        )
