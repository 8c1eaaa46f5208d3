"""Static (pre-allocated) KV cache, gpt-fast style, with an optional FP8 (E4M3) storage format.

Buffers are [L, B, H_kv, S_max, D]. `update(layer, k, v, start)` writes the new keys/values at cache positions
`start .. start+S-1` and returns what attention reads:
- `start` an int: views over the written prefix [0, start+S);
- `start` a 0-dim LongTensor: the whole [0, S_max) buffer (fixed shapes, so a decode step can be captured in a CUDA
  graph; the caller masks the unwritten tail, which holds zeros, never NaN).

FP8 storage: with `dtype=torch.float8_e4m3fn`, K and V are stored as e4m3 with one FP32 dequantization scale per layer
(`set_scales`): quantize on write `clamp(x / scale, -448, 448).to(e4m3)`, dequantize on read `q * scale`, returned in
the dtype of the incoming k/v. Scales come from QKV calibration on the trainer (the precision package).
"""

from __future__ import annotations

import torch
from torch import nn

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_E4M3_MAX = 448.0


class KVCache:
    """Pre-allocated K/V buffers for `num_layers` layers of a batch of `batch_size` sequences."""

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

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        batch_size: int,
        max_seq_len: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """A cache sized from a HF Llama/Qwen2/Qwen3 config."""
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(
            cfg.num_hidden_layers,
            batch_size,
            cfg.num_key_value_heads,
            max_seq_len,
            head_dim,
            dtype=dtype,
            device=device,
        )

    @property
    def is_fp8(self) -> bool:
        return self.dtype == FP8_KV_DTYPE

    @property
    def bytes_per_token(self) -> int:
        """Bytes one cached token takes over all layers, K and V (per-layer FP8 scales are not per token)."""
        _, _, heads, _, head_dim = self.k.shape
        return 2 * self.num_layers * heads * head_dim * self.k.element_size()

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def set_scales(self, k_scales: torch.Tensor, v_scales: torch.Tensor) -> None:
        """Per-layer FP32 dequantization scales [L] for K and V (FP8 caches only); must be finite and > 0."""
        if not self.is_fp8:
            raise ValueError(f"set_scales is for FP8 KV caches; this cache stores {self.dtype}")
        for name, scales in (("k_scales", k_scales), ("v_scales", v_scales)):
            if scales.shape != (self.num_layers,):
                raise ValueError(f"{name} must have shape [L={self.num_layers}], got {tuple(scales.shape)}")
            if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
                raise ValueError(f"{name} must be finite and > 0, got {scales.tolist()}")
        self.k_scales = k_scales.detach().to(device=self.k.device, dtype=torch.float32)
        self.v_scales = v_scales.detach().to(device=self.k.device, dtype=torch.float32)

    def reset(self) -> None:
        """Zero the buffers (scales are kept)."""
        self.k.zero_()
        self.v.zero_()

    def _encode(self, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        if scale is None:
            return x.to(self.dtype)
        return torch.clamp(x.float() / scale, -FP8_E4M3_MAX, FP8_E4M3_MAX).to(self.dtype)

    @staticmethod
    def _decode(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        if scale is None:
            return stored.to(dtype)
        return (stored.float() * scale).to(dtype)

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
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != self.batch_size:
            raise ValueError(
                f"k and v must both be [B={self.batch_size}, H_kv, S, D]; got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} out of range for a {self.num_layers}-layer cache")
        k_scale = v_scale = None
        if self.is_fp8:
            if self.k_scales is None or self.v_scales is None:
                raise ValueError("an FP8 KVCache needs set_scales(k_scales, v_scales) before update()")
            k_scale, v_scale = self.k_scales[layer], self.v_scales[layer]
        seq = k.shape[2]
        k_buf, v_buf = self.k[layer], self.v[layer]  # [B, H_kv, S_max, D]
        if isinstance(start, torch.Tensor):
            positions = start + self._positions[:seq]  # [S]
            self._index_write(k_buf, positions, self._encode(k, k_scale))
            self._index_write(v_buf, positions, self._encode(v, v_scale))
            return self._decode(k_buf, k_scale, k.dtype), self._decode(v_buf, v_scale, v.dtype)
        end = start + seq
        if start < 0 or end > self.max_seq_len:
            raise ValueError(f"positions [{start}, {end}) fall outside the cache's [0, {self.max_seq_len})")
        k_buf[:, :, start:end] = self._encode(k, k_scale)
        v_buf[:, :, start:end] = self._encode(v, v_scale)
        return self._decode(k_buf[:, :, :end], k_scale, k.dtype), self._decode(v_buf[:, :, :end], v_scale, v.dtype)
