"""Batched next-token sampling on device: greedy, temperature, top-k, top-p, one random stream per sequence.

The returned logprob is that of the chosen token under `log_softmax(logits / temperature)` over the FULL vocabulary,
i.e. BEFORE top-k / top-p filtering. That is the quantity the trainer recomputes (`sequence_logprobs` with the same
temperature), so rollout and trainer logprobs are comparable token by token; filtering only restricts which tokens
can be drawn. Greedy picks the argmax (first index on ties, like HF) and reports the same unfiltered logprob.

Sampling is inverse-CDF: one uniform per row, `u * total` located in the row's float64 cumulative probabilities
(zero-probability tokens are never hit). On CUDA without top-k / top-p, one kernel draws the token and its logprob
(`sample_kernel.py`; this module's torch path is its twin; the exact mode recomputes the logprob with its own
log-sum-exp). The uniform is a counter-based hash of (sequence key, draw index) (`uniforms`, splitmix64), so a
sequence's draws depend on its own key and position only: not on which other sequences share the batch, the batch
order, or when a continuous-batching scheduler admits it. No host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_jetrl.models.logprobs import token_logprobs

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # splitmix64 constants as signed int64 (torch has no uint64 arithmetic)
_MUL1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MUL2 = 0x94D049BB133111EB - (1 << 64)


@dataclass(frozen=True)
class SamplingParams:
    """temperature > 0; top_p in (0, 1]; top_k None (off) or >= 1."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be None or >= 1, got {self.top_k}")


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors (two's-complement wrap-around), elementwise."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    return z ^ _shr(z, 31)


def sequence_keys(seed: int, sequence_ids: torch.Tensor) -> torch.Tensor:
    """[N] int64 stream keys of sequences `sequence_ids` [N] (their index in a `generate` call) under `seed`."""
    base = mix64(torch.tensor(int(seed) % (1 << 63), dtype=torch.int64))
    return mix64(sequence_ids.long() ^ base.to(sequence_ids.device))


def seed_of(generator: torch.Generator | None) -> int:
    """The seed a call's streams derive from: the generator's initial seed, else a fresh draw on the host."""
    if generator is not None:
        return int(generator.initial_seed())
    return int(torch.randint(0, 2**62, ()).item())


def uniforms(keys: torch.Tensor, counters: torch.Tensor | int) -> torch.Tensor:
    """[B] float64 in [0, 1): draw number `counters` [B] (or one int for all) of the streams `keys` [B] int64.

    An int counter is mixed on the host into a 0-dim CPU tensor, which a GPU kernel takes as a scalar argument: a
    Python int sent to the GPU as a tensor is a blocking copy, which stalled every decode step until the device
    had drained (the bits are the same: int64 arithmetic wraps alike on both)."""
    if isinstance(counters, torch.Tensor):
        counters = counters.to(dtype=torch.int64, device=keys.device)
    else:
        counters = torch.tensor(int(counters), dtype=torch.int64)  # 0-dim, on the host
    bits = mix64(keys ^ mix64(counters))
    return _shr(bits, 11).double() * (2.0**-53)


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Set logits [B, V] outside the top-k / top-p (nucleus) set to -inf; the argmax always survives."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # [B, V] probability of strictly better tokens
        drop_sorted = mass_before >= top_p  # the first token has mass_before 0 < top_p: never dropped
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    *,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    keys: torch.Tensor | None = None,
    counters: torch.Tensor | int = 0,
    batch_invariant: bool = False,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] long and their logprobs [B] float32 (unfiltered, see module doc) from logits [B, V].

    keys [B] int64: each row's stream (`sequence_keys`); counters: each row's draw index. Without keys, row i takes
    stream i of the generator's seed (`seed_of`). batch_invariant: the exact mode's logprob (`token_logprobs`); on
    CUDA the token is still the fused kernel's draw (one program per row: a row's draw does not depend on its batch),
    only its logprob is recomputed by the exact mode's log-sum-exp. fused: the one-kernel draw (`sample_kernel`)
    where no top-k / top-p filters; None = on CUDA."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    if not greedy and keys is None:
        keys = sequence_keys(seed_of(generator), torch.arange(logits.shape[0], device=logits.device))
    fused = logits.is_cuda if fused is None else fused
    if fused and not greedy and params.top_k is None and params.top_p == 1.0:
        from nemo_jetrl.generation.native.sample_kernel import sample_fused  # token + logprob in one kernel

        tokens, logprobs = sample_fused(logits, uniforms(keys, counters), params.temperature)
        if not batch_invariant:
            return tokens, logprobs
        return tokens, token_logprobs(logits, tokens, params.temperature, batch_invariant=True)
    scaled = logits.float() / params.temperature  # [B, V]
    if greedy:
        tokens = torch.argmax(scaled, dim=-1)  # [B]
    else:
        probs = filter_logits(scaled, params.top_k, params.top_p).softmax(dim=-1)  # [B, V]
        cdf = probs.double().cumsum(dim=-1)  # [B, V]
        target = uniforms(keys, counters) * cdf[:, -1]  # [B] in [0, total)
        tokens = torch.searchsorted(cdf, target[:, None], right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
    return tokens, token_logprobs(logits, tokens, params.temperature, batch_invariant=batch_invariant)
