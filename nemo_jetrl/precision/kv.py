"""FP8 (E4M3) KV cache quantization, per-step QKV scale calibration, and the trainer's K/V fake-quant.

One per-layer FP32 *dequantization* scale per tensor kind (Q, K, V), the recipe's conventions:

    scale = max(amax * margin, 1e-10) * float32(1/448)       (calibration, `kv_scale_from_amax`)
    q     = clamp(x / scale, -448, 448) -> e4m3              (`kv_quant`: rollout cache write)
    x'    = (float32(q) * scale) -> x.dtype                  (`kv_dequant`: what attention reads)

`kv_fake_quant` is `kv_dequant(kv_quant(x))` with a straight-through gradient: the trainer's attention then sees the
very K/V values the rollout's FP8 cache held (same scales, same bits), while gradients flow as if unquantized.

Calibration (`QKVCalibrator`) follows NeMo-RL (PR #1212): an attn_hook on every attention's q/k/v (after RoPE and
q/k-norm) records the per-layer amax of each forward (= micro-batch); `scales()` takes a percentile of those amaxes
across micro-batches (default 99.9th, linear interpolation like `numpy.percentile`) and a margin (default 1.05).
Amaxes stay on the device (no host sync per micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_jetrl.precision.quant import E4M3_MAX, FP8_DTYPE, INV_E4M3_MAX, SCALE_EPS, triton_available
from nemo_jetrl.precision.recipe import KVCalibration

QKV = ("q", "k", "v")


@dataclass(frozen=True)
class KVScales:
    """Per-layer FP32 dequantization scales, each [L]: q (for FP8 attention math), k and v (the FP8 cache)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    def __post_init__(self) -> None:
        for name in QKV:
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.float32:
                raise ValueError(f"KVScales.{name} must be a float32 [L] tensor, got {getattr(t, 'shape', t)!r}")
        if not self.q.shape == self.k.shape == self.v.shape:
            raise ValueError(f"KVScales: q/k/v lengths differ: {self.q.shape}, {self.k.shape}, {self.v.shape}")

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_scales [L], v_scales [L]): what `GenerationInterface.update_weights(kv_scales=...)` takes."""
        return self.k, self.v

    def to(self, device: torch.device | str) -> KVScales:
        return KVScales(*(getattr(self, n).to(device) for n in QKV))

    def metrics(self) -> dict[str, float]:
        """Mean / max of each kind's scales (one host sync), for logging."""
        stats = torch.stack([torch.stack([getattr(self, n).mean(), getattr(self, n).max()]) for n in QKV]).tolist()
        return {f"{n}_scale_{s}": v for n, row in zip(QKV, stats) for s, v in zip(("mean", "max"), row)}


def kv_scale_from_amax(amax: torch.Tensor, margin: float = 1.05) -> torch.Tensor:
    """FP32 dequant scale(s) `max(amax * margin, 1e-10) * float32(1/448)` from amax(es) >= 0."""
    if not float(margin) >= 1.0:
        raise ValueError(f"margin must be >= 1.0, got {margin!r}")
    return (amax.float() * float(margin)).clamp_min(SCALE_EPS) * INV_E4M3_MAX


def kv_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [...] (any float dtype) with a scalar FP32 scale -> e4m3 [...]; IEEE division, saturating clamp."""
    return torch.clamp(x.float() / scale, -E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)


def kv_dequant(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 [...] -> `dtype` [...], `(float32(q) * scale).to(dtype)`."""
    return (q.float() * scale).to(dtype)


# Elements per slice of the fake-quant's FP32 round trip: its temporaries stay at a few 64-MiB slices instead of
# three FP32 copies of a long micro-batch's K and V (0.26 GiB each at the 8B shape and 4 x 16,896 tokens).
FAKE_QUANT_SLICE_ELEMENTS = 1 << 24


def _dense_storage(x: torch.Tensor) -> torch.Tensor | None:
    """x's elements as the [N] contiguous run of memory they fill, when they fill one without gaps or overlaps (a
    contiguous tensor or a permutation of one, as the trainer's [B, H, S, D] views of [B, S, H, D] buffers); else
    None."""
    dims = sorted((st, n) for st, n in zip(x.stride(), x.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return None
        expected *= size
    return x.as_strided((x.numel(),), (1,))


def _fake_quant(x: torch.Tensor, scale: torch.Tensor, slice_elements: int) -> torch.Tensor:
    """`kv_dequant(kv_quant(x, scale), scale, x.dtype)`, bitwise: on CUDA with Triton one kernel over x's memory
    (`triton_quant.kv_round_trip`: no FP32 temporaries, one read and one write) where x fills one dense run of it;
    else `_fake_quant_by_slices`."""
    on_gpu = x.is_cuda and scale.device == x.device and scale.numel() == 1 and triton_available()
    flat = _dense_storage(x) if on_gpu else None
    if flat is None:
        return _fake_quant_by_slices(x, scale, slice_elements)
    from nemo_jetrl.precision.kernels.triton_quant import kv_round_trip

    out = torch.empty_like(x)  # x's strides, so its memory is the same dense run
    kv_round_trip(flat, scale.float().reshape(1), out=_dense_storage(out))
    return out


def _fake_quant_by_slices(x: torch.Tensor, scale: torch.Tensor, slice_elements: int) -> torch.Tensor:
    """`kv_dequant(kv_quant(x, scale), scale, x.dtype)` for x [..., S, D], computed over slices of S into one output
    with x's layout; elementwise, so bitwise the whole-tensor round trip."""
    if x.dim() < 2 or x.numel() <= slice_elements:
        return kv_dequant(kv_quant(x, scale), scale, x.dtype)
    out = torch.empty_like(x)  # x's strides (the trainer's [B, H, S, D] views of [B, S, H, D] buffers)
    seq = x.shape[-2]
    step = max(1, slice_elements // (x.numel() // seq))
    for start in range(0, seq, step):
        part = x[..., start:start + step, :]
        out[..., start:start + step, :] = kv_dequant(kv_quant(part, scale), scale, x.dtype)
    return out


class _KVFakeQuant(torch.autograd.Function):
    """Forward: the FP8 cache round trip (`_fake_quant`); backward: identity (straight-through estimator)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor, slice_elements: int) -> torch.Tensor:
        return _fake_quant(x, scale, slice_elements)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return grad_out, None, None


def kv_fake_quant(
    x: torch.Tensor, scale: torch.Tensor, slice_elements: int = FAKE_QUANT_SLICE_ELEMENTS
) -> torch.Tensor:
    """`kv_dequant(kv_quant(x, scale), scale, x.dtype)`, bitwise, with a straight-through gradient; x [..., S, D] is
    converted `slice_elements` at a time along S (the FP32 temporaries' bound)."""
    return _KVFakeQuant.apply(x, scale, int(slice_elements))


class QKVCalibrator:
    """attn_hook observer: per-layer amax of Q, K, V for each forward pass; scales from a percentile across passes.

    A call with `layer_idx == 0` opens a new record (one decoder forward = one micro-batch). The hook returns its
    inputs unchanged, so it composes with a fake-quant hook (observe first, then quantize: see `make_attn_hook`).
    A recomputed forward (activation checkpointing) observes nothing: `replay` is None (no transform).
    """

    replay = None

    def __init__(self, num_layers: int, calibration: KVCalibration | None = None) -> None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"QKVCalibrator: num_layers must be an int >= 1, got {num_layers!r}")
        self.num_layers = num_layers
        self.calibration = calibration if calibration is not None else KVCalibration()
        self._records: list[torch.Tensor] = []  # each [L, 3] fp32 (q, k, v amax) on the activations' device
        self._seen: list[bool] = []

    @property
    def num_micro_batches(self) -> int:
        return len(self._records)

    @property
    def records(self) -> list[torch.Tensor]:
        """The [L, 3] amax record of every forward observed, in order (`add_record` replays them elsewhere)."""
        return list(self._records)

    def reset(self) -> None:
        self._records, self._seen = [], []

    @torch.no_grad()
    def observe(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Record max |q|, |k|, |v| of one layer of the current forward ([B, H, S, D] each)."""
        if not 0 <= layer_idx < self.num_layers:
            raise ValueError(f"QKVCalibrator: layer {layer_idx} out of range for {self.num_layers} layers")
        if layer_idx == 0 or not self._records:
            self._records.append(torch.zeros(self.num_layers, 3, dtype=torch.float32, device=k.device))
            self._seen.append(False)
        amax = torch.stack([t.detach().abs().amax().float() for t in (q, k, v)])  # [3]
        self._records[-1][layer_idx] = torch.maximum(self._records[-1][layer_idx], amax)
        if layer_idx == self.num_layers - 1:
            self._seen[-1] = True

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.observe(layer_idx, q, k, v)
        return q, k, v

    def add_record(self, amax: torch.Tensor) -> None:
        """One whole forward's per-layer (q, k, v) amax [L, 3] observed by another calibrator (`last_record` of a
        captured forward's scratch calibrator)."""
        if tuple(amax.shape) != (self.num_layers, 3):
            raise ValueError(f"QKVCalibrator: a record is [{self.num_layers}, 3], got {tuple(amax.shape)}")
        self._records.append(amax.float())
        self._seen.append(True)

    def last_record(self) -> torch.Tensor:
        """[L, 3] fp32 amax of the last forward observed (every layer of it)."""
        if not self._records or not self._seen[-1]:
            raise ValueError("QKVCalibrator: no complete forward observed")
        return self._records[-1]

    def amax(self) -> torch.Tensor:
        """[L, 3] fp32: the calibration percentile over micro-batches of each layer's q/k/v amax."""
        if not self._records:
            raise ValueError("QKVCalibrator: nothing observed (run a forward with this calibrator as attn_hook)")
        if not all(self._seen):
            raise ValueError("QKVCalibrator: a forward stopped before its last layer; records are incomplete")
        stacked = torch.stack(self._records)  # [n_micro, L, 3]
        if stacked.shape[0] == 1:
            return stacked[0]
        return torch.quantile(stacked, self.calibration.percentile / 100.0, dim=0, interpolation="linear")

    def scales(self) -> KVScales:
        """Per-layer scales `percentile(amax) * margin / 448` for Q, K and V."""
        scale = kv_scale_from_amax(self.amax(), self.calibration.margin)  # [L, 3]
        return KVScales(scale[:, 0].contiguous(), scale[:, 1].contiguous(), scale[:, 2].contiguous())


def make_attn_hook(
    calibrator: QKVCalibrator | None = None,
    fake_quant: KVScales | None = None,
    *,
    quantize_q: bool = False,
):
    """The trainer's attn_hook: observe raw Q/K/V (calibration), then fake-quantize K/V (and Q with `quantize_q`)
    with the rollout's scales. None when there is nothing to do. Its `replay` (what a recomputed forward calls,
    models/recompute.py) fake-quantizes without observing."""
    if calibrator is None and fake_quant is None:
        return None

    def hook(layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        if calibrator is not None:
            calibrator.observe(layer_idx, q, k, v)
        if fake_quant is not None:
            if quantize_q:
                q = kv_fake_quant(q, fake_quant.q[layer_idx])
            k = kv_fake_quant(k, fake_quant.k[layer_idx])
            v = kv_fake_quant(v, fake_quant.v[layer_idx])
        return q, k, v

    hook.replay = make_attn_hook(None, fake_quant, quantize_q=quantize_q) if calibrator is not None else hook
    return hook
