"""Kernel timings of the exact mode against the fast path at Qwen3-8B shapes (GPU), and the tile configurations.

    python3 -m benchmarks.bench_batch_invariant_kernels --out bi_kernels.json
    python3 -m benchmarks.bench_batch_invariant_kernels --shapes   # attention at the 1.7B / 8B shapes, alternating

`--shapes`: decode steps of 64 rows over 1,024-8,192 keys (8B), of 32 over 4,096 and 8,192 (1.7B, the 8K CLI run's
batch) and the trainer's forward; the exact kernel with its keys in chunks (`ATTN_SPLIT_KEYS`, a decode step's
chunks in parallel programs) and with one chunk a row (as before the chunks) beside the fast kernels. Decode also
reads the cache as the engine's rollout does: paged (`PAGE_SIZES` keys a block, blocks shuffled, the table
`PAGED_SLACK` keys wider than the row, as a recipe's max_total_sequence_length leaves it), fast and exact; the exact
paged output is checked bitwise against the contiguous one before it is timed. The exact decode also reads the same
values from a bf16 cache (twice the bytes, no e4m3 widening): what the widening costs. The trainer's forward runs as
the trainer runs it (the CUDA kernel where it serves) and over the same rows packed into one, CUDA and Triton
kernels side by side, each checked bitwise against the Triton kernel before it is timed.

FP8 linears (q/k/v grouped, o, gate/up grouped, down) at M = 64 (decode), 4096 (trainer micro-batch) and 16384
(prefill of 64 x 256): `fp8_blockwise_mm` auto (cuBLAS / split-K Triton) vs the batch-invariant GEMM with its
default and alternative tiles; the lm_head (BF16, vocabulary 151936) vs cuBLAS; decode attention (64 rows, 384
cached keys, FP8 cache) and prefill attention (64 x 256) vs the fast kernels. Medians of `triton.testing.do_bench`.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from benchmarks.common import device_info, report
from nemo_jetrl.generation.native.decode_attention import decode_attention
from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.models.batch_invariant_attention import attention, paged_attention
from nemo_jetrl.precision import act_quant, fp8_blockwise_mm, weight_quant
from nemo_jetrl.precision.kernels import triton_batch_invariant as T
from nemo_jetrl.precision.kv import kv_dequant, kv_quant

PAGE_SIZES = (16, 64)  # policy.generation.kv_block_size: the default, and one key block of the exact kernel
PAGED_SLACK = 512  # the table's keys beyond the row's (e.g. 4,608 against a 4,096-token response)
FP8_SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
ALT_CONFIGS = {64: [(64, 128, 4, 4), (64, 64, 4, 3), (64, 32, 4, 4)], 4096: [(128, 256, 8, 3), (128, 128, 4, 4)]}


def bench(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50))


def gemm_rows(dev) -> list[dict]:
    rows = []
    for name, (n, k) in FP8_SHAPES.items():
        w = torch.randn(n, k, device=dev) * 0.02
        wq, ws = weight_quant(w)
        for m in (64, 4096, 16384):
            xq, xs = act_quant(torch.randn(m, k, device=dev))
            ops = (xq, xs, wq, ws, torch.bfloat16)
            fast = bench(lambda ops=ops: fp8_blockwise_mm(*ops))
            row = {"variant": f"fp8 {name} M={m}", "fast_ms": fast}
            row["exact_ms"] = bench(lambda ops=ops: T.fp8_gemm(*ops))
            for cfg in ALT_CONFIGS.get(min(m, 4096), []):
                row[f"exact{cfg}_ms"] = bench(lambda c=cfg, ops=ops: T.fp8_gemm(*ops, config=c))
            row["exact_over_fast"] = row["exact_ms"] / fast
            rows.append(row)
            print(row, flush=True)
    w = (torch.randn(151936, 4096, device=dev) * 0.02).bfloat16()
    for m in (64, 4096):
        x = torch.randn(m, 4096, device=dev).bfloat16()
        fast = bench(lambda x=x: F.linear(x, w))
        row = {"variant": f"lm_head M={m}", "fast_ms": fast, "exact_ms": bench(lambda x=x: T.mm(x, w))}
        row["exact_over_fast"] = row["exact_ms"] / fast
        rows.append(row)
        print(row, flush=True)
    return rows


DECODE_CONFIGS = ((16, 4, 2), (16, 4, 3), (16, 4, 4), (32, 4, 3), (64, 4, 2), (64, 4, 3))


def attention_rows(dev) -> list[dict]:
    bsz, heads, kv_heads, dim, ctx = 64, 32, 8, 128, 384
    scale = dim**-0.5
    ks, vs = torch.tensor(0.01, device=dev), torch.tensor(0.01, device=dev)
    k = kv_quant(torch.randn(bsz, kv_heads, 512, dim, device=dev), ks)
    v = kv_quant(torch.randn(bsz, kv_heads, 512, dim, device=dev), vs)
    valid = torch.zeros(bsz, 512, dtype=torch.bool, device=dev)
    valid[:, :ctx] = True
    q = torch.randn(bsz, heads, 1, dim, device=dev).bfloat16()
    kv_len = torch.tensor(ctx, device=dev)
    fast = bench(lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, scale, ks, vs))
    start = torch.tensor(ctx - 1, device=dev)
    exact = bench(lambda: attention(q, k, v, valid, start, scale, ks, vs))
    rows = [{"variant": "decode attention fp8 kv, 64 x 384", "fast_ms": fast, "exact_ms": exact}]
    for config in DECODE_CONFIGS:  # (query rows per program, warps, stages) the decode may take (tested bitwise)
        ms = bench(lambda c=config: K.attention(q, k, v, valid, start, scale, ks, vs, config=c))
        rows.append({"variant": f"decode attention fp8 kv, config {config}", "fast_ms": fast, "exact_ms": ms})
    qp = torch.randn(bsz, heads, 256, dim, device=dev).bfloat16()
    kp = torch.randn(bsz, kv_heads, 256, dim, device=dev).bfloat16()
    vp = torch.randn(bsz, kv_heads, 256, dim, device=dev).bfloat16()
    mask = torch.ones(256, 256, dtype=torch.bool, device=dev).tril()[None, None].expand(bsz, 1, 256, 256)
    rep = heads // kv_heads
    kr, vr = kp.repeat_interleave(rep, 1), vp.repeat_interleave(rep, 1)
    fast = bench(lambda: F.scaled_dot_product_attention(qp, kr, vr, attn_mask=mask, scale=scale))
    exact = bench(lambda: attention(qp, kp, vp, valid[:, :256], 0, scale))
    rows.append({"variant": "prefill attention, 64 x 256 (fast: masked SDPA)", "fast_ms": fast, "exact_ms": exact})
    for r in rows:
        r["exact_over_fast"] = r["exact_ms"] / r["fast_ms"]
        print(r, flush=True)
    return rows


# (label, rows, query heads, keys) of the `--shapes` rows: H_kv 8, head_dim 128, an e4m3 cache for decode
SHAPE_DECODE = [("decode 1.7B 128 x 640", 128, 16, 640), ("decode 8B 64 x 1024", 64, 32, 1024),
                ("decode 8B 64 x 2048", 64, 32, 2048), ("decode 8B 64 x 4096", 64, 32, 4096),
                ("decode 8B 64 x 8192", 64, 32, 8192), ("decode 8B 16 x 8192", 16, 32, 8192),
                # the 1.7B CLI run at 8K-token responses (4 prompts x 8): its mean and its last context
                ("decode 1.7B 32 x 4096", 32, 16, 4096), ("decode 1.7B 32 x 8192", 32, 16, 8192)]  # fmt: skip
SHAPE_TRAIN = [("trainer fwd 1.7B 16 x 1024", 16, 16, 1024), ("trainer fwd 8B 4 x 4096", 4, 32, 4096)]


def shape_rows(dev, rounds: int = 5, configs: tuple = ()) -> list[dict]:
    """The exact attention against the fast kernel at the 1.7B and 8B shapes (decode: the FP8-cache decode kernel;
    the trainer's forward: causal SDPA), alternating over `rounds` rounds of do_bench; configs: other (query rows,
    warps, stages) of the exact kernel timed beside its default."""
    from benchmarks.common import alternating_rounds, cold_time_fields

    rows = []
    for label, bsz, heads, n in SHAPE_DECODE + SHAPE_TRAIN:
        variants = _shape_variants(dev, label.startswith("decode"), bsz, heads, n, configs)
        times = {name: [] for name in variants}
        for _, order in alternating_rounds(list(variants), rounds):
            for name in order:
                times[name].append(1000 * bench(variants[name]))
        fields = {name: cold_time_fields(t) for name, t in times.items()}
        base = next(iter(fields.values()))["us"]  # the fast kernel's
        for name, f in fields.items():
            rows.append({"variant": f"{label}: {name}", **f, "over_fast": f["us"] / base})
            print(rows[-1], flush=True)
    return rows


def _shape_variants(dev, decode: bool, bsz: int, heads: int, n: int, configs: tuple = ()) -> dict:
    """{name: callable}: the fast kernel, then the exact attention (its default and each of `configs`, named "...
    OTHER BITS" where its output differs from the default's); decode: one query per row over n keys of an e4m3
    cache [bsz, 8, n, 128]; else the trainer's causal forward over bsz x n tokens (bf16)."""
    scale, ks, vs = 128**-0.5, torch.tensor(0.01, device=dev), torch.tensor(0.01, device=dev)
    valid = torch.ones(bsz, n, dtype=torch.bool, device=dev)
    if decode:
        k = kv_quant(torch.randn(bsz, 8, n, 128, device=dev), ks)  # [B, 8, n, 128] e4m3
        v = kv_quant(torch.randn(bsz, 8, n, 128, device=dev), vs)
        q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
        kv_len, start = torch.tensor(n, device=dev), torch.tensor(n - 1, device=dev)
        out = {"fast (fp8 decode kernel)": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, scale, ks, vs)}
        args = (q, k, v, valid, start, scale, ks, vs)
    else:
        q = torch.randn(bsz, heads, n, 128, device=dev).bfloat16()
        k, v = torch.randn(bsz, 8, n, 128, device=dev).bfloat16(), torch.randn(bsz, 8, n, 128, device=dev).bfloat16()
        kr, vr = k.repeat_interleave(heads // 8, 1), v.repeat_interleave(heads // 8, 1)  # [B, H, n, 128]
        start = torch.tensor(0, device=dev)
        out = {"fast (causal SDPA)": lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True, scale=scale)}
        args = (q, k, v, valid, start, scale)
    out[f"exact (batch-invariant, chunks of {K.ATTN_SPLIT_KEYS})"] = lambda: attention(*args)
    out["exact, one chunk"] = lambda: _one_chunk(attention, *args)  # the kernel before its keys came in chunks
    if decode:  # `attention` takes the CUDA decode where it serves (models/exact_cuda_choice.py): Triton beside it
        out["exact, Triton kernel"] = lambda: K.attention(*args)
    want = K.attention(*args)  # the default's output, against which configs and the paged kernel are checked
    if decode:
        # the same values in a bf16 cache: twice the bytes, no e4m3 widening (what the widening costs)
        args16 = (q, kv_dequant(k, ks, q.dtype), kv_dequant(v, vs, q.dtype), valid, start, scale)
        out["exact, bf16 cache (same values)"] = lambda: attention(*args16)
        out |= _paged_variants(q, k, v, ks, vs, scale, want, configs)
    if not decode:
        out |= _trainer_variants(q, k, v, valid, scale, want)
    for c in configs:
        name = _bits_named(f"exact config {c}", K.attention(*args, config=c), want)
        out[name] = lambda c=c: K.attention(*args, config=c)
    return out


def _trainer_variants(q, k, v, valid, scale, want) -> dict:
    """{name: callable}: the trainer's forward as `batch_invariant_train` runs it (the CUDA kernel where it serves,
    `models/exact_cuda_choice.py`), over the padded rows and over the same rows packed into one, each beside the
    Triton kernel; raises where the CUDA kernel's output differs in any bit from the Triton kernel's `want`."""
    from nemo_jetrl.models import exact_train_cuda
    from nemo_jetrl.models.batch_invariant_train import causal_attention

    bsz, heads, n, dim = q.shape
    if not torch.equal(causal_attention(q, k, v, valid, scale), want):
        raise AssertionError("the trainer's exact forward differs from the Triton kernel's bits")
    out = {"exact trainer forward (as the trainer runs it)": lambda: causal_attention(q, k, v, valid, scale)}

    def pack(t):  # [B, H, n, D] -> [1, H, B * n, D]
        return t.transpose(1, 2).reshape(1, bsz * n, t.shape[1], dim).transpose(1, 2)

    qp, kp, vp = pack(q), pack(k), pack(v)
    cu = (torch.arange(bsz + 1, device=q.device) * n).int()
    if exact_train_cuda.kernel_problem(q, k, v) is None:
        if not torch.equal(exact_train_cuda.forward(qp, kp, vp, None, cu, n, scale)[0], pack(want)):
            raise AssertionError("the packed CUDA trainer forward differs from the Triton kernel's bits")
        out["exact packed, CUDA kernel"] = lambda: exact_train_cuda.forward(qp, kp, vp, None, cu, n, scale)
    out["exact packed, Triton kernel"] = lambda: K.varlen_attention(qp, kp, vp, cu, n, scale)
    return out


def _bits_named(name: str, got: torch.Tensor, want: torch.Tensor) -> str:
    """`name`, with " OTHER BITS" where a configuration's output `got` differs from the default's `want`."""
    return name if torch.equal(got, want) else f"{name} OTHER BITS"


def _paged_variants(q, k, v, ks, vs, scale, want, configs: tuple = ()) -> dict:
    """{name: callable}: the decode step over the cache k/v [B, H_kv, n, D] laid out as the engine's paged pool,
    fast and exact, per page size of `PAGE_SIZES`, and the exact kernel under each of `configs` (named "... OTHER
    BITS" where its output differs from the default's); raises if the exact paged output differs in any bit from
    `want`, the contiguous exact kernel's."""
    bsz, kv_heads, n, dim = k.shape
    kv_len = torch.full((bsz,), n, dtype=torch.int64, device=k.device)
    out = {}
    for page in PAGE_SIZES:
        per_row = -(-(n + PAGED_SLACK) // page)  # the table's blocks a row
        table = (torch.randperm(bsz * per_row, device=k.device, dtype=torch.int32) + 1).view(bsz, per_row)  # [B, M]
        pools = []
        for cache in (k, v):  # moved as bytes: indexing and fills need not support e4m3
            pool = torch.zeros(bsz * per_row + 1, kv_heads, page, dim, dtype=torch.uint8, device=k.device)
            padded = torch.zeros(bsz, kv_heads, per_row * page, dim, dtype=torch.uint8, device=k.device)
            padded[:, :, :n] = cache.view(torch.uint8)
            pool[table.flatten().long()] = padded.view(bsz, kv_heads, per_row, page, dim).transpose(1, 2).flatten(0, 1)
            pools.append(pool.view(cache.dtype))  # [blocks, H_kv, page, D]; block 0 unused (the engine's trash block)
        paged = (q, *pools, table, kv_len, scale, ks, vs)
        if not torch.equal(K.paged_attention(*paged), want):
            raise AssertionError(f"exact paged attention (pages of {page}) differs from the contiguous kernel's bits")
        out[f"fast, paged (pages of {page})"] = lambda p=pools, t=table: decode_attention(
            q[:, :, 0], *p, None, kv_len, scale, ks, vs, block_table=t
        )
        out[f"exact, paged (pages of {page})"] = lambda a=paged: paged_attention(*a)
        out[f"exact, paged (pages of {page}), one chunk"] = lambda a=paged: _one_chunk(K.paged_attention, *a)
        out[f"exact, paged (pages of {page}), Triton kernel"] = lambda a=paged: K.paged_attention(*a)
        for c in configs:
            name = _bits_named(f"exact, paged (pages of {page}), config {c}", K.paged_attention(*paged, config=c), want)
            out[name] = lambda a=paged, c=c: K.paged_attention(*a, config=c)
    return out


def _one_chunk(fn, *args):
    """fn(*args) with every row's keys in one chunk (one program over all of them, no merge kernel)."""
    chunk = K.ATTN_SPLIT_KEYS
    K.ATTN_SPLIT_KEYS = 1 << 30
    try:
        return fn(*args)
    finally:
        K.ATTN_SPLIT_KEYS = chunk


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--attention-only", action="store_true", help="the attention rows only")
    p.add_argument("--shapes", action="store_true", help="only the attention at the 1.7B / 8B shapes, alternating")
    p.add_argument("--configs", nargs="*", default=[], metavar="ROWS,WARPS,STAGES",
                   help="with --shapes: also time these exact-kernel configs, contiguous and paged")  # fmt: skip
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_batch_invariant_kernels: needs a CUDA GPU", file=sys.stderr)
        return 0
    dev = torch.device("cuda")
    info = device_info(dev)
    if args.shapes:
        rows = shape_rows(dev, configs=tuple(tuple(int(x) for x in c.split(",")) for c in args.configs))
        title = f"exact attention vs the fast kernels on {info['device']} (us, medians of 5 alternating rounds)"
        report(title, ["variant", "us", "min-max us", "/ fast"], ["variant", "us", "min_max_us", "over_fast"], rows,
               args=args, info=info, shape={}, n_layers=0)  # fmt: skip
        return 0
    rows = attention_rows(dev) + ([] if args.attention_only else gemm_rows(dev))
    title = f"exact-mode kernels vs the fast path on {info['device']} (ms, medians of triton.testing.do_bench)"
    report(title, ["variant", "fast ms", "exact ms", "exact / fast"], ["variant", "fast_ms", "exact_ms", "exact_over_fast"],
           rows, args=args, info=info, shape={}, n_layers=0)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
