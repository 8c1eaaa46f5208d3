"""Which kernel runs a decode step of the exact attention over an e4m3 cache (`batch_invariant_attention` asks): the
CUDA kernel (`exact_decode_cuda`) where it fits and, on this device, gave the Triton kernel's bits; else the Triton
kernel (`batch_invariant_kernels`). The bits are the GPU's property (the CUDA kernel runs per-warp MMAs where Triton
runs warp-group ones), so they are compared once per device and kind of call, on random caches, before the CUDA
kernel serves one. Imported on CUDA only."""

from __future__ import annotations

import warnings

import torch

from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.models.exact_decode_cuda import HEAD_DIM, decode, kernel_problem


def takes_cuda(q, k_buf, v_buf, key_valid, paged: bool) -> bool:
    """Whether a decode step (q [B, H, 1, D]) runs `exact_decode_cuda`: an e4m3 cache it serves (`serves`)."""
    return q.shape[2] == 1 and k_buf.dtype == torch.float8_e4m3fn and serves(q, k_buf, v_buf, key_valid, paged)


def decode_step(q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale, v_scale,
                block_table: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """`exact_decode_cuda.decode` into a new output: [B, H, 1, D] in q.dtype (the Triton kernel's result layout)."""
    out = torch.empty((q.shape[0], 1, q.shape[1], HEAD_DIM), dtype=q.dtype, device=q.device)  # [B, 1, H, D]
    decode(q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale, v_scale, out, block_table)
    return out.transpose(1, 2)


_AGREES: dict[tuple[int, int, bool], bool] = {}  # (device index, query heads a KV head, paged): same bits as Triton


def serves(q, k_buf, v_buf, key_valid, paged: bool) -> bool:
    """Whether a decode step takes the CUDA kernel: it fits (`kernel_problem`) and, on this device, gave the Triton
    kernel's bits (`agrees_with_triton`, run at the first eager call of each kind; a call inside a CUDA-graph
    capture before that takes Triton, and a graph's warm-up runs eagerly first)."""
    if kernel_problem(q, k_buf, v_buf, None if paged else key_valid) is not None:
        return False
    key = (q.device.index or 0, q.shape[1] // k_buf.shape[1], paged)
    if key not in _AGREES:
        if torch.cuda.is_current_stream_capturing():
            return False
        _AGREES[key] = agrees_with_triton(q.device, key[1], paged)
        if not _AGREES[key]:
            warnings.warn(f"exact decode: the CUDA kernel's bits differ from the Triton kernel's on "
                          f"{torch.cuda.get_device_name(q.device)} ({key[1]} query heads a KV head, paged {paged}); "
                          "the decode stays on Triton", stacklevel=2)  # fmt: skip
    return _AGREES[key]


def agrees_with_triton(device: torch.device, n_rep: int, paged: bool) -> bool:
    """The CUDA and the Triton kernel on random e4m3 caches of 6 rows x 2 KV heads (keys 1 to 3,000: one to
    three chunks; a contiguous cache with left padding and masked holes): bit for bit equal outputs."""
    gen = torch.Generator(device=device).manual_seed(0)
    lens = torch.tensor([1, 63, 64, 1025, 2049, 3000], device=device)
    bsz, kv_heads, width = len(lens), 2, 3008

    def e4m3(*shape):
        return (torch.randn(*shape, generator=gen, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)

    q = torch.randn(bsz, kv_heads * n_rep, 1, HEAD_DIM, generator=gen, device=device).bfloat16()
    scales = torch.tensor(0.0123, device=device), torch.tensor(0.0071, device=device)
    out = torch.empty(bsz, 1, q.shape[1], HEAD_DIM, dtype=q.dtype, device=device)
    if paged:
        page = 16
        pool_k, pool_v = (e4m3(bsz * width // page, kv_heads, page, HEAD_DIM) for _ in range(2))
        table = torch.randperm(bsz * width // page, generator=gen, device=device).int().view(bsz, -1)
        ref = K.paged_attention(q, pool_k, pool_v, table, lens, 0.088, *scales)
        decode(q, pool_k, pool_v, None, lens - 1, 0.088, *scales, out, block_table=table)
    else:
        k_buf, v_buf = (e4m3(bsz, kv_heads, width, HEAD_DIM) for _ in range(2))
        cols = torch.arange(width, device=device)
        valid = (cols >= torch.tensor([0, 5, 0, 70, 1, 300], device=device)[:, None]) & (cols % 97 != 5)
        ref = K.attention(q, k_buf, v_buf, valid, lens + 7, 0.088, *scales)
        decode(q, k_buf, v_buf, valid, lens + 7, 0.088, *scales, out)
    return torch.equal(ref, out.transpose(1, 2))
