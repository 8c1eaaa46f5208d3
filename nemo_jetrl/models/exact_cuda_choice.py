"""Which kernel runs the exact attention: a decode step over an e4m3 cache (`batch_invariant_attention` asks) and
the trainer's forward (`batch_invariant_train` asks) take the hand-written CUDA kernel (`exact_decode_cuda`,
`exact_train_cuda`) where it fits and, on this device, gave the Triton kernel's bits; else the Triton kernel
(`batch_invariant_kernels`). The bits are the GPU's property (the CUDA kernels run per-warp MMAs where Triton runs
warp-group ones, the trainer's with the operands' roles swapped), so they are compared once per device and kind of
call, on random inputs, before a CUDA kernel serves one. Imported on CUDA only."""

from __future__ import annotations

import warnings

import torch

from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.models import exact_train_cuda
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


# (kind "decode" / "train", device index, query heads a KV head, paged / packed): the same bits as Triton
_AGREES: dict[tuple[str, int, int, bool], bool] = {}


def serves(q, k_buf, v_buf, key_valid, paged: bool) -> bool:
    """Whether a decode step takes the CUDA kernel: it fits (`kernel_problem`) and, on this device, gave the Triton
    kernel's bits (`agrees_with_triton`, run at the first eager call of each kind; a call inside a CUDA-graph
    capture before that takes Triton, and a graph's warm-up runs eagerly first)."""
    if kernel_problem(q, k_buf, v_buf, None if paged else key_valid) is not None:
        return False
    return _agrees("decode", q, q.shape[1] // k_buf.shape[1], paged)


def train_serves(q, k, v, packed: bool, key_valid: torch.Tensor | None = None) -> bool:
    """Whether the trainer's forward (q [B, H, S, D] over its own keys; padded rows: their key_valid) takes
    `exact_train_cuda`: it fits and, on this device, gave the Triton kernel's bits (`train_agrees_with_triton`, at
    the first eager call of each kind)."""
    if exact_train_cuda.kernel_problem(q, k, v, key_valid) is not None:
        return False
    return _agrees("train", q, q.shape[1] // k.shape[1], packed)


def _agrees(kind: str, q: torch.Tensor, n_rep: int, layout: bool) -> bool:
    """The comparison's verdict for (kind, q's device, n_rep, layout), made at its first eager call (warns where
    the bits differ); False inside a CUDA-graph capture before that."""
    key = (kind, q.device.index or 0, n_rep, layout)
    if key not in _AGREES:
        if torch.cuda.is_current_stream_capturing():
            return False
        compare = agrees_with_triton if kind == "decode" else train_agrees_with_triton
        _AGREES[key] = compare(q.device, n_rep, layout)
        if not _AGREES[key]:
            warnings.warn(f"exact attention: the CUDA {kind} kernel's bits differ from the Triton kernel's on "
                          f"{torch.cuda.get_device_name(q.device)} ({n_rep} query heads a KV head, "
                          f"{'paged' if kind == 'decode' else 'packed'} {layout}); it stays on Triton",
                          stacklevel=3)  # fmt: skip
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


def train_agrees_with_triton(device: torch.device, n_rep: int, packed: bool) -> bool:
    """The CUDA and the Triton trainer forward on random bf16 q / k / v, 2 KV heads: outputs bit for bit equal and
    the log-sum-exp within 1e-6 (the backward's input, not compared to the rollout). Packed: segments of 1 to 2,300
    tokens (one to three chunks); padded: 4 rows of 1,100 with left and right padding."""
    gen = torch.Generator(device=device).manual_seed(1)
    kv_heads = 2

    def rand(heads, tokens, bsz=1, mag=1.0):
        return (torch.randn(bsz, heads, tokens, HEAD_DIM, generator=gen, device=device) * mag).bfloat16()

    if packed:
        lens = torch.tensor([1, 63, 64, 700, 1025, 2300], device=device)
        cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).int()
        total = int(lens.sum())
        q, k, v = rand(kv_heads * n_rep, total, mag=3.0), rand(kv_heads, total), rand(kv_heads, total)
        ref, ref_lse = K.varlen_attention(q, k, v, cu, 2300, 0.088)
        out, lse = exact_train_cuda.forward(q, k, v, None, cu, 2300, 0.088)
    else:
        bsz, seq = 4, 1100
        q, k, v = rand(kv_heads * n_rep, seq, bsz, 3.0), rand(kv_heads, seq, bsz), rand(kv_heads, seq, bsz)
        cols = torch.arange(seq, device=device)
        lead = torch.tensor([0, 3, 70, 1050], device=device)[:, None]
        valid = (cols >= lead) & (cols < lead + torch.tensor([1100, 900, 1030, 40], device=device)[:, None])
        ref, ref_lse = K.padded_train_attention(q, k, v, valid, 0.088)
        out, lse = exact_train_cuda.forward(q, k, v, valid, None, 0, 0.088)
    return torch.equal(ref, out) and torch.allclose(lse, ref_lse, rtol=1e-6, atol=1e-6)
