"""Static (pre-allocated) KV cache, gpt-fast style, with an optional FP8 (E4M3) storage format.

Buffers are [L, B, H_kv, S_max, D]. `update(layer, k, v, start)` writes the new keys/values at cache positions
`start .. start+S-1` and returns what attention reads:
- `start` an int: views over the written prefix [0, start+S);
- `start` a 0-dim LongTensor: the whole [0, S_max) buffer (fixed shapes, so a decode step can be captured in a CUDA
  graph; the caller masks the unwritten tail, which holds zeros, never NaN);
- `start` a [B] LongTensor (one new token per row; the reference of the paged write): row b writes at start[b];
  the whole buffer is returned, as for a 0-dim start.

FP8 storage: with `dtype=torch.float8_e4m3fn`, K and V are stored as e4m3 with one FP32 dequantization scale per layer
(`set_scales`): quantize on write `clamp(x / scale, -448, 448).to(e4m3)`, dequantize on read `q * scale`, returned in
the dtype of the incoming k/v (`precision.kv`). Scales come from QKV calibration on the trainer. An FP8 token takes
half the bytes of a bf16 one (`bytes_per_token`).

Fused decode (`fused_decode=True`, CUDA + Triton, bf16/fp32 queries): `decode_attention` writes the new token (K
and V, FP8-quantized where the cache is FP8, in one kernel: `write_decode_kv`) and attends straight over the stored
buffer (FP8 tiles dequantized in registers, `decode_attention.py`) instead of
returning a dequantized copy of the cache; the CPU path stays the exact `update` + SDPA.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_jetrl.generation.native.decode_attention import (
    decode_attention,
    triton_decode_available,
    write_decode_kv,
)
from nemo_jetrl.precision.kv import kv_dequant, kv_quant
from nemo_jetrl.precision.quant import E4M3_MAX as FP8_E4M3_MAX

FP8_KV_DTYPE = torch.float8_e4m3fn
__all__ = ["FP8_E4M3_MAX", "FP8_KV_DTYPE", "KVCache", "encode_kv"]


def encode_kv(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """x as a cache of `dtype` stores it: `kv_quant` with the layer's scale for FP8, else a cast."""
    return x.to(dtype) if scale is None else kv_quant(x, scale)


def model_head_dim(cfg) -> int:
    """Attention head width of an HF config (`head_dim`, else hidden_size / num_attention_heads)."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class LayerKvScales:
    """What an FP8 K/V store keeps besides its buffers, shared by `KVCache` and the paged `PagedKVCache`: per-layer
    FP32 dequantization scales [L] and the dtype checks around them. The store sets `dtype`, `num_layers`, `k`, `v`
    and `k_scales = v_scales = None`."""

    @property
    def is_fp8(self) -> bool:
        return self.dtype == FP8_KV_DTYPE

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def set_scales(self, k_scales: torch.Tensor, v_scales: torch.Tensor) -> None:
        """Per-layer FP32 dequantization scales [L] for K and V (FP8 stores only); must be finite and > 0."""
        if not self.is_fp8:
            raise ValueError(f"set_scales is for FP8 KV caches; this cache stores {self.dtype}")
        for name, scales in (("k_scales", k_scales), ("v_scales", v_scales)):
            if scales.shape != (self.num_layers,):
                raise ValueError(f"{name} must have shape [L={self.num_layers}], got {tuple(scales.shape)}")
            if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
                raise ValueError(f"{name} must be finite and > 0, got {scales.tolist()}")
        self.k_scales = k_scales.detach().to(device=self.k.device, dtype=torch.float32)
        self.v_scales = v_scales.detach().to(device=self.k.device, dtype=torch.float32)

    def layer_scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This layer's (k, v) dequantization scales (0-dim fp32) for an FP8 store, (None, None) otherwise."""
        if not self.is_fp8:
            return None, None
        if self.k_scales is None or self.v_scales is None:
            raise ValueError(f"an FP8 {type(self).__name__} needs set_scales(k_scales, v_scales) before it is written")
        return self.k_scales[layer], self.v_scales[layer]


class KVCache(LayerKvScales):
    """Pre-allocated K/V buffers for `num_layers` layers of a batch of `batch_size` sequences."""

    is_paged = False  # the exact mode's attention reads these buffers itself (`PagedKVCache` serves its own)

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        fused_decode: bool = False,
    ) -> None:
        dims = dict(
            num_layers=num_layers,
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            max_seq_len=max_seq_len,
            head_dim=head_dim,
        )
        bad = {name: value for name, value in dims.items() if int(value) <= 0}
        if bad:
            raise ValueError(f"KVCache dimensions must be positive, got {bad}")
        if not (dtype.is_floating_point or dtype == FP8_KV_DTYPE):
            raise ValueError(f"KVCache dtype must be a floating dtype or float8_e4m3fn, got {dtype}")
        self.num_layers, self.batch_size, self.max_seq_len = num_layers, batch_size, max_seq_len
        self.dtype = dtype
        shape = (num_layers, batch_size, num_kv_heads, max_seq_len, head_dim)
        # Zero-filled, not empty: masked-out keys still enter P @ V as 0 * value, and 0 * NaN would be NaN.
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H_kv, S_max, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, H_kv, S_max, D]
        self.k_scales: torch.Tensor | None = None  # [L] fp32, FP8 only
        self.v_scales: torch.Tensor | None = None  # [L] fp32, FP8 only
        self._positions = torch.arange(max_seq_len, device=self.k.device)  # [S_max]
        if fused_decode and not (self.k.is_cuda and triton_decode_available()):
            raise ValueError("fused_decode needs a CUDA cache and triton")
        self.fused_decode = bool(fused_decode)
        self._kv_lens: dict[int, torch.Tensor] = {}  # int prefix length -> device scalar (fused decode)

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        batch_size: int,
        max_seq_len: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
        fused_decode: bool = False,
    ) -> KVCache:
        """A cache sized from a HF Llama/Qwen2/Qwen3 config."""
        cfg = model.config
        head_dim = model_head_dim(cfg)
        return cls(
            cfg.num_hidden_layers,
            batch_size,
            cfg.num_key_value_heads,
            max_seq_len,
            head_dim,
            dtype=dtype,
            device=device,
            fused_decode=fused_decode,
        )

    @staticmethod
    def token_bytes(model: nn.Module, dtype: torch.dtype) -> int:
        """Bytes one cached token takes over all layers of `model`, K and V, stored as `dtype`."""
        cfg = model.config
        head_dim = model_head_dim(cfg)
        return (
            2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        )

    @property
    def bytes_per_token(self) -> int:
        """Bytes one cached token takes over all layers, K and V (per-layer FP8 scales are not per token)."""
        _, _, heads, _, head_dim = self.k.shape
        return 2 * self.num_layers * heads * head_dim * self.k.element_size()

    def reset(self) -> None:
        """Zero the buffers (scales are kept)."""
        self.k.zero_()
        self.v.zero_()

    def _encode(self, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return encode_kv(x, self.dtype, scale)

    @staticmethod
    def _decode(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        return stored.to(dtype) if scale is None else kv_dequant(stored, scale, dtype)

    @staticmethod
    def _index_write(buf: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> None:
        """buf[:, :, positions] = values; FP8 goes through a uint8 view (index_copy_ has no fp8 kernel on CPU)."""
        if buf.dtype == FP8_KV_DTYPE:
            buf, values = buf.view(torch.uint8), values.view(torch.uint8)
        buf.index_copy_(2, positions, values)

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, H_kv, S, D] at positions start..start+S-1 of `layer`; return K/V to attend over.

        Returns [B, H_kv, start+S, D] for an int `start`, [B, H_kv, S_max, D] for a tensor `start`, in k's dtype.
        """
        k_scale, v_scale = self._write(layer, k, v, start)
        k_buf, v_buf = self.k[layer], self.v[layer]  # [B, H_kv, S_max, D]
        if not isinstance(start, torch.Tensor):
            end = start + k.shape[2]
            k_buf, v_buf = k_buf[:, :, :end], v_buf[:, :, :end]
        return self._decode(k_buf, k_scale, k.dtype), self._decode(v_buf, v_scale, v.dtype)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor) -> None:
        """Store k, v [B, H_kv, S, D] at positions start..start+S-1 of `layer` (quantized for FP8), for an
        attention that reads the stored buffers itself (the exact mode's). One token per row at a tensor `start`
        on CUDA: one kernel for K and V (`write_decode_kv`, bitwise `_write`)."""
        if isinstance(start, torch.Tensor) and k.shape[2] == 1 and self.k.is_cuda and triton_decode_available():
            self._check_write(layer, k, v)
            k_scale, v_scale = self.layer_scales(layer)
            write_decode_kv(self.k[layer], self.v[layer], k, v, start + 1, k_scale, v_scale)
            return
        self._write(layer, k, v, start)

    def uses_fused_decode(self, q: torch.Tensor) -> bool:
        """Whether `decode_attention` serves this query: fused decode on, one new token, bf16/fp32 math."""
        return self.fused_decode and q.shape[2] == 1 and q.dtype in (torch.bfloat16, torch.float32)

    def decode_attention(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        start: int | torch.Tensor,
        mask: torch.Tensor,
        sm_scale: float,
    ) -> torch.Tensor:
        """Write the new token's k, v [B, H_kv, 1, D] at `start` (int, 0-dim or [B] per row), attend q [B, H, 1, D]
        over keys [0, start] where `mask` [B, 1, 1, S_total] (bool) allows. Returns [B, H, 1, D] in q.dtype."""
        self._check_write(layer, k, v)
        if k.shape[2] != 1:
            raise ValueError(f"decode_attention takes one new token per sequence, got k {tuple(k.shape)}")
        k_scale, v_scale = self.layer_scales(layer)
        if isinstance(start, torch.Tensor):
            kv_len = start + 1
        else:
            if not 0 <= start < self.max_seq_len:
                raise ValueError(f"position {start} falls outside the cache's [0, {self.max_seq_len})")
            if start + 1 not in self._kv_lens:
                self._kv_lens[start + 1] = torch.tensor(start + 1, device=self.k.device)
            kv_len = self._kv_lens[start + 1]
        write_decode_kv(self.k[layer], self.v[layer], k, v, kv_len, k_scale, v_scale)  # one launch for K and V
        out = decode_attention(
            q[:, :, 0], self.k[layer], self.v[layer], mask[:, 0, 0], kv_len, sm_scale, k_scale, v_scale
        )  # [B, H, D]
        return out[:, :, None]

    def _check_write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != self.batch_size:
            raise ValueError(
                f"k and v must both be [B={self.batch_size}, H_kv, S, D]; got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} out of range for a {self.num_layers}-layer cache")

    def _write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Store k, v [B, H_kv, S, D] at start..start+S-1 of `layer` (quantized for FP8); returns the scales."""
        self._check_write(layer, k, v)
        k_scale, v_scale = self.layer_scales(layer)
        seq = k.shape[2]
        k_buf, v_buf = self.k[layer], self.v[layer]  # [B, H_kv, S_max, D]
        if isinstance(start, torch.Tensor) and start.dim() == 1:  # per-row columns, one token each
            if seq != 1 or start.shape != (self.batch_size,):
                raise ValueError(
                    f"per-row starts take one token per row: start {tuple(start.shape)}, k {tuple(k.shape)}"
                )
            rows = torch.arange(self.batch_size, device=self.k.device)  # [B]
            for buf, value, scale in ((k_buf, k, k_scale), (v_buf, v, v_scale)):
                encoded = self._encode(value[:, :, 0], scale)  # [B, H_kv, D]
                if buf.dtype == FP8_KV_DTYPE:
                    buf, encoded = buf.view(torch.uint8), encoded.view(torch.uint8)
                buf[rows, :, start] = encoded
            return k_scale, v_scale
        if isinstance(start, torch.Tensor):
            positions = start + self._positions[:seq]  # [S]
            self._index_write(k_buf, positions, self._encode(k, k_scale))
            self._index_write(v_buf, positions, self._encode(v, v_scale))
            return k_scale, v_scale
        end = start + seq
        if start < 0 or end > self.max_seq_len:
            raise ValueError(f"positions [{start}, {end}) fall outside the cache's [0, {self.max_seq_len})")
        k_buf[:, :, start:end] = self._encode(k, k_scale)
        v_buf[:, :, start:end] = self._encode(v, v_scale)
        return k_scale, v_scale


def resolve_kv_cache_dtype(kv_cache_dtype: str | torch.dtype | None, attention_dtype: torch.dtype) -> torch.dtype:
    """None / "auto" -> the attention dtype; "fp8" / float8_e4m3fn -> FP8; any floating torch dtype as given."""
    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return attention_dtype
    if kv_cache_dtype in ("fp8", FP8_KV_DTYPE):
        return FP8_KV_DTYPE
    if isinstance(kv_cache_dtype, torch.dtype) and kv_cache_dtype.is_floating_point:
        return kv_cache_dtype
    raise ValueError(f"kv_cache_dtype must be None, 'auto', 'fp8' or a floating torch dtype, got {kv_cache_dtype!r}")
