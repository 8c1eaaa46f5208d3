"""Probe (issue 44): the chunked batch-invariant FP8 GEMM (the exact mode's: fma chains over chunks of K blocks,
chunk sums in order) as the matched kernels' GEMM for some shapes. Decode rows (64, 128): cuBLAS padded, the fast
path's split-K pick, and the chunked kernel split over its chunks at several tiles and chunk sizes. Trainer rows
(8,192; 24,576): cuBLAS against the chunked kernel's large tiles. Bits: decode rows == trainer rows per chunking."""
# ruff: noqa: B023, E731  (each lambda runs inside its own loop iteration)

import json
import os
import statistics
import sys

import torch
import triton
import triton.testing

from nemo_jetrl.precision import gemm
from nemo_jetrl.precision.kernels import triton_batch_invariant as BI
from nemo_jetrl.precision.kernels.device import cold_copies, time_in_graph
from nemo_jetrl.precision.quant import act_quant, weight_quant


def chunked(x, xs, w, ws, cfg, split, chunk):
    (m, k), n = x.shape, w.shape[0]
    ws = ws.contiguous()
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    chunks = triton.cdiv(k // 128, chunk)
    bm, bn, warps, stages = cfg
    out = torch.empty((chunks, m, n), dtype=torch.float32, device=x.device) if split else y
    BI._fp8_gemm_kernel[(n // bn, triton.cdiv(m, bm), chunks if split else 1)](
        x,
        xs,
        w,
        ws,
        out,
        y,
        m,
        n,
        k,
        x.stride(0),
        xs.stride(0),
        xs.stride(1),
        w.stride(0),
        ws.stride(0),
        n,
        m * n,
        BLOCK_M=bm,
        BLOCK_N=bn,
        CHUNK=chunk,
        SPLIT=split,
        HAS_BIAS=False,
        num_warps=warps,
        num_stages=stages,
    )
    if split:
        BI._chunk_sum_kernel[(triton.cdiv(m * n, 1024),)](out, y, y, m * n, n, chunks, HAS_BIAS=False, BLOCK=1024)
    return y


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    shapes = {
        "1.7b qkv": (4096, 2048),
        "1.7b o": (2048, 2048),
        "1.7b gate_up": (12288, 2048),
        "1.7b down": (2048, 6144),
        "8b qkv": (6144, 4096),
        "8b o": (4096, 4096),
        "8b gate_up": (24576, 4096),
        "8b down": (4096, 12288),
    }
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    dec_cfgs = [(64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 32, 4, 4), (128, 32, 8, 4)]
    big_cfgs = [(128, 128, 8, 3), (128, 128, 8, 4), (128, 256, 8, 3), (64, 256, 4, 3)]
    for name, (n, k) in shapes.items():
        row = {}
        xb = torch.randn(24576, k, device=dev) * torch.rand(24576, 1, device=dev) * 3
        xq, xs = act_quant(xb)
        del xb
        wq, ws = weight_quant(torch.randn(n, k, device=dev) * 0.02)
        cc = cold_copies(n * k, dev)
        wqs = [wq] + [wq.clone() for _ in range(cc - 1)]
        wss = [ws] + [ws.clone() for _ in range(cc - 1)]
        for chunk in (8, 4, 2):
            ref = chunked(xq[:8192], xs[:8192], wq, ws, (128, 128, 8, 3), False, chunk)
            ok = all(
                torch.equal(chunked(xq[:m], xs[:m], wq, ws, c, sp, chunk), ref[:m])
                for m in (128, 64)
                for c in dec_cfgs[:4]
                for sp in (True, False)
            )
            row[f"chunk {chunk} decode==trainer bits"] = ok
        for m in (128, 64):
            xm, xsm = xq[:m], xs[:m]
            t = {
                "cublas_pad": time_in_graph(
                    [
                        lambda a=a, b=b: gemm.fp8_blockwise_mm(xm, xsm, a, b, backend="scaled_mm_padded")
                        for a, b in zip(wqs, wss)
                    ]
                ),
                "fast auto": time_in_graph(
                    [lambda a=a, b=b: gemm.fp8_blockwise_mm(xm, xsm, a, b) for a, b in zip(wqs, wss)]
                ),
            }
            for chunk in (8, 4, 2):
                best = None
                for c in dec_cfgs:
                    ms = time_in_graph(
                        [lambda a=a, b=b: chunked(xm, xsm, a, b, c, True, chunk) for a, b in zip(wqs, wss)]
                    )
                    if best is None or ms < best[0]:
                        best = (ms, c)
                t[f"chunked {chunk} split best"] = best
            row[f"M {m} us"] = {
                kk: (round(v * 1000, 1) if isinstance(v, float) else (round(v[0] * 1000, 1), v[1]))
                for kk, v in t.items()
            }
        for m in (8192, 24576):
            xm, xsm = xq[:m], xs[:m]
            t = {"cublas": [], **{str(c): [] for c in big_cfgs}}
            fns = {"cublas": lambda: gemm.fp8_blockwise_mm(xm, xsm, wq, ws, backend="scaled_mm")}
            for c in big_cfgs:
                fns[str(c)] = lambda c=c: chunked(xm, xsm, wq, ws, c, False, 8)
            for r in range(5):
                for kk in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                    t[kk].append(triton.testing.do_bench(fns[kk], rep=30))
            row[f"M {m} us (chunk 8)"] = {kk: round(statistics.median(v) * 1000, 1) for kk, v in t.items()}
            f4 = lambda: chunked(xm, xsm, wq, ws, (128, 128, 8, 3), False, 4)
            row[f"M {m} us (chunk 4, 128x128x8x3)"] = round(triton.testing.do_bench(f4, rep=30) * 1000, 1)
        res[name] = row
        print(name, json.dumps(row), flush=True)
        del xq, xs
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "chunked_gemm.json"), "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
