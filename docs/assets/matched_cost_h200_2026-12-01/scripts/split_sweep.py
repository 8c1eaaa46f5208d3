"""The matched rollout at the 1.7B shape (128 rows, 180 -> 512 tokens) with the exact attention's keys in chunks of
1024 (shipped), 512, 256 and 128 (ATTN_SPLIT_KEYS; a decode step runs its chunks in parallel programs), beside the
fast rollout; variants alternating, 5 timed rounds. Also the kernel alone at 128 rows x 448 / 692 keys."""
import argparse
import json
import sys

import torch
import triton.testing

from benchmarks.bench_exact_rollout import engines, rollout
from benchmarks.common import SHAPES, alternating_timings, device_info
from nemo_jetrl.generation.native.decode_attention import decode_attention
from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.precision.kv import kv_quant

CHUNKS = (1024, 512, 256, 128)
dev = torch.device("cuda")
args = argparse.Namespace(gen_len=512, layers=28, modes=["matched"])
shape = dict(SHAPES["qwen3-1.7b"])
gen = torch.Generator().manual_seed(0)
prompt_t = torch.randint(1, shape["vocab_size"], (128, 180), generator=gen)
prompts = prompt_t.tolist()
pair = engines("jetrl_kv", shape, args, prompt_t, dev)


def with_chunk(c, engine):
    def run():
        K.ATTN_SPLIT_KEYS = c
        rollout(engine, prompts, dev)
    return run


variants = {"fast": with_chunk(1024, pair["fast"])}
variants |= {f"matched chunks {c}": with_chunk(c, pair["matched"]) for c in CHUNKS}
t = alternating_timings(variants, 1, 5, dev)
out = {"device": device_info(dev), "rollout": t}
base = t["fast"]["median_s"]
for n, r in t.items():
    print(f"{n:22s} {r['median_s']:.3f} s ({r['min_s']:.3f}-{r['max_s']:.3f})  {r['median_s'] / base:.3f}x", flush=True)
# the kernel alone
scale, ks, vs = 128**-0.5, torch.tensor(0.01, device=dev), torch.tensor(0.01, device=dev)
kern = {}
for n in (448, 692):
    valid = torch.ones(128, n, dtype=torch.bool, device=dev)
    k = kv_quant(torch.randn(128, 8, n, 128, device=dev), ks)
    v = kv_quant(torch.randn(128, 8, n, 128, device=dev), vs)
    q = torch.randn(128, 16, 1, 128, device=dev).bfloat16()
    kv_len, start = torch.tensor(n, device=dev), torch.tensor(n - 1, device=dev)
    row = {"fast": triton.testing.do_bench(lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, scale, ks, vs), warmup=10, rep=100)}  # noqa: B023  # noqa: B023
    for c in CHUNKS:
        K.ATTN_SPLIT_KEYS = c
        row[f"exact {c}"] = triton.testing.do_bench(lambda: K.attention(q, k, v, valid, start, scale, ks, vs), warmup=10, rep=100)  # noqa: B023  # noqa: B023
    K.ATTN_SPLIT_KEYS = 1024
    kern[n] = row
    print(n, {a: round(b * 1000, 1) for a, b in row.items()}, "us", flush=True)
out["kernel_ms"] = kern
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
