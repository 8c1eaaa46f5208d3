"""The CUDA exact decode against the Triton exact decode: bits, then time (and the fast FP8 decode beside)."""
import json
import os
import sys
import time

import torch
import triton

from nemo_jetrl.generation.native.decode_attention import decode_attention
from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.models import exact_decode_cuda as C

dev = "cuda"
FP8 = torch.float8_e4m3fn
results = {"device": torch.cuda.get_device_name(), "bits": [], "time": []}


def cuda_decode(q, kb, vb, valid, qs, sm, ks, vs, table=None, stages=C.STAGES, minb=C.MIN_BLOCKS):
    bsz, heads, _, dim = q.shape
    width = table.shape[1] * kb.shape[2] if table is not None else kb.shape[2]
    splits = triton.cdiv(width, K.ATTN_SPLIT_KEYS)
    entries = bsz * heads
    part = torch.empty(splits * entries * (dim + 2), dtype=torch.float32, device=q.device)
    C.launch(q, kb, vb, valid, qs, sm, ks, vs, part, splits, block_table=table, stages=stages, min_blocks=minb)
    out = torch.empty((bsz, 1, heads, dim), dtype=q.dtype, device=q.device)
    K._merge_splits_kernel[(entries,)](part, out, splits, 1, heads, out.stride(0), out.stride(2), out.stride(1),
                                       D=dim, HW=True, num_warps=1)
    return out.transpose(1, 2)


def paged_case(bsz, heads, kvh, lens, page=16, qmag=1.0, kvmag=1.0, seed=0):
    gen = torch.Generator(device=dev).manual_seed(seed)
    maxb = -(-max(lens) // page)
    nblocks = bsz * maxb + 3
    perm = torch.randperm(nblocks, generator=gen, device=dev)[: bsz * maxb].int().view(bsz, maxb)
    kp = (torch.randn(nblocks, kvh, page, 128, generator=gen, device=dev) * 100 * kvmag).clamp(-440, 440).to(FP8)
    vp = (torch.randn(nblocks, kvh, page, 128, generator=gen, device=dev) * 100 * kvmag).clamp(-440, 440).to(FP8)
    q = (torch.randn(bsz, heads, 1, 128, generator=gen, device=dev) * qmag).bfloat16()
    kv_len = torch.tensor(lens, dtype=torch.int64, device=dev)
    ks = torch.tensor(0.013 + 0.001 * seed, device=dev)
    vs = torch.tensor(0.0071, device=dev)
    return q, kp, vp, perm, kv_len, ks, vs


def contiguous_case(bsz, heads, kvh, s_k, leads, qcols, qmag=1.0, seed=0):
    gen = torch.Generator(device=dev).manual_seed(seed)
    kb = (torch.randn(bsz, kvh, s_k, 128, generator=gen, device=dev) * 100).clamp(-440, 440).to(FP8)
    vb = (torch.randn(bsz, kvh, s_k, 128, generator=gen, device=dev) * 100).clamp(-440, 440).to(FP8)
    q = (torch.randn(bsz, heads, 1, 128, generator=gen, device=dev) * qmag).bfloat16()
    cols = torch.arange(s_k, device=dev)
    valid = cols[None] >= torch.tensor(leads, device=dev)[:, None]
    valid[:, 5::97] = False  # holes
    qs = torch.tensor(qcols, dtype=torch.int64, device=dev)
    return q, kb, vb, valid, qs, torch.tensor(0.011, device=dev), torch.tensor(0.0093, device=dev)


def compare(name, ref, got):
    eq = torch.equal(ref, got)
    diff = (ref.float() - got.float()).abs()
    row = dict(name=name, equal=eq, mismatched=int((ref != got).sum()), of=ref.numel(), max_abs=float(diff.max()),
               ref_max=float(ref.float().abs().max()))
    results["bits"].append(row)
    print("BITS", json.dumps(row), flush=True)


# ---- bits
sm = 128 ** -0.5
t0 = time.time()
try:
    for seed, (qmag, kvmag) in enumerate([(1.0, 1.0), (8.0, 1.0), (0.05, 1.0), (30.0, 2.0)]):
        g = torch.Generator().manual_seed(seed)
        lens = [int(x) for x in torch.randint(1, 4200, (64,), generator=g)]
        lens[:4] = [1, 64, 65, 1024]
        lens[4:8] = [1025, 2048, 4096, 4111]
        q, kp, vp, table, kv_len, ks, vs = paged_case(64, 32, 8, lens, qmag=qmag, kvmag=kvmag, seed=seed)
        ref = K.paged_attention(q, kp, vp, table, kv_len, sm, ks, vs)
        compare(f"paged 8B 64 rows mixed lens seed {seed} q x{qmag}", ref,
                cuda_decode(q, kp, vp, None, kv_len - 1, sm, ks, vs, table=table))
    for nrep, kvh in ((2, 8), (1, 4), (8, 2), (5, 3)):
        q, kp, vp, table, kv_len, ks, vs = paged_case(16, nrep * kvh, kvh, [436] * 8 + [17, 700, 1500, 3000] * 2, seed=7)
        ref = K.paged_attention(q, kp, vp, table, kv_len, sm, ks, vs)
        compare(f"paged n_rep {nrep} kv heads {kvh}", ref, cuda_decode(q, kp, vp, None, kv_len - 1, sm, ks, vs, table=table))
    q, kb, vb, valid, qs, ks, vs = contiguous_case(32, 16, 8, 2200, [0, 3, 70, 200] * 8, [2199, 1000, 436, 2150] * 8)
    ref = K.attention(q, kb, vb, valid, qs, sm, ks, vs)
    compare("contiguous 1.7B 32 rows left-padded, holes", ref, cuda_decode(q, kb, vb, valid, qs, sm, ks, vs))
    q, kb, vb, valid, qs, ks, vs = contiguous_case(128, 16, 8, 436, [0, 13] * 64, [435] * 128)
    ref = K.attention(q, kb, vb, valid, qs, sm, ks, vs)
    compare("contiguous 1.7B 128 x 436", ref, cuda_decode(q, kb, vb, valid, qs, sm, ks, vs))
    # configs give the same bits
    q, kp, vp, table, kv_len, ks, vs = paged_case(64, 32, 8, [3000] * 64, seed=3)
    ref = K.paged_attention(q, kp, vp, table, kv_len, sm, ks, vs)
    for st, mb in ((2, 4), (3, 4), (6, 2)):
        compare(f"config stages {st} minb {mb}", ref,
                cuda_decode(q, kp, vp, None, kv_len - 1, sm, ks, vs, table=table, stages=st, minb=mb))
except Exception:  # keep going to the timing
    import traceback

    traceback.print_exc()
print(f"bits done in {time.time() - t0:.1f} s", flush=True)

# ---- time: Triton exact vs CUDA exact vs fast CUDA, CUDA-graph timing, 5 alternating rounds
def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=50)

shapes = [("8B 64 x 4,096 paged", 64, 32, 8, 4096), ("8B 64 x 2,000 paged", 64, 32, 8, 2000),
          ("8B 64 x 1,000 paged", 64, 32, 8, 1000), ("1.7B 128 x 436 paged", 128, 16, 8, 436),
          ("1.7B 32 x 4,096 paged", 32, 16, 8, 4096)]
variants = sys.argv[1:] or ["4,3", "3,4", "2,4"]


def time_shape(name, bsz, heads, kvh, n):
    q, kp, vp, table, kv_len, ks, vs = paged_case(bsz, heads, kvh, [n] * bsz, seed=1)
    fns = {"triton exact": lambda: K.paged_attention(q, kp, vp, table, kv_len, sm, ks, vs),
           "fast cuda": lambda: decode_attention(q[:, :, 0], kp, vp, None, kv_len, sm, ks, vs, block_table=table,
                                                 impl="cuda")}
    for v in variants:
        st, mb = map(int, v.split(","))
        fns[f"cuda exact {st}x{mb}"] = (lambda st=st, mb=mb: cuda_decode(q, kp, vp, None, kv_len - 1, sm, ks, vs,
                                                                         table=table, stages=st, minb=mb))
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(5):
        for k in (order if r % 2 == 0 else order[::-1]):
            times[k].append(bench(fns[k]) * 1000)
    for k, ts in times.items():
        ts.sort()
        row = dict(shape=name, variant=k, median_us=round(ts[2], 1), min=round(ts[0], 1), max=round(ts[-1], 1))
        results["time"].append(row)
        print("TIME", json.dumps(row), flush=True)


for shape in shapes:
    time_shape(*shape)
out = os.environ.get("OUT", "/tmp")
json.dump(results, open(f"{out}/exact_cuda_check.json", "w"), indent=1)
