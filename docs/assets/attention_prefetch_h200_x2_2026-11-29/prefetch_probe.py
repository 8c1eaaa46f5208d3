"""Exact attention before / after the one-block-ahead K/V loads: bits equal, and times (CUDA graph of 10 calls,
medians of 7 alternating rounds x 5 replays) at the 8B / 1.7B decode (paged and contiguous, e4m3) and the trainer's
forward (bf16, with log-sum-exp)."""

import importlib.util
import json
import os
import statistics

import torch

import nemo_jetrl.models.batch_invariant_kernels as NEW

spec = importlib.util.spec_from_file_location("bik_before", ".gpu/bik_before.py")
OLD = importlib.util.module_from_spec(spec)
spec.loader.exec_module(OLD)
dev = "cuda"
torch.manual_seed(0)


def graph(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    return g


def t(g):
    a, b = torch.cuda.Event(True), torch.cuda.Event(True)
    a.record()
    g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 100  # us per call


cases = {}


def paged_case(name, B, H, HKV, keys, width, page=16):
    D = 128
    nb = B * width // page + 1
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    kp = (torch.randn(nb, HKV, page, D, device=dev) * 2).to(torch.float8_e4m3fn)
    vp = (torch.randn(nb, HKV, page, D, device=dev) * 2).to(torch.float8_e4m3fn)
    perm = torch.randperm(nb - 1, device=dev)[: B * (width // page)] + 1
    table = perm.to(torch.int32).view(B, -1)
    kv_len = torch.randint(keys // 2, keys + 1, (B,), device=dev, dtype=torch.int64)
    kv_len[0] = keys
    ks = torch.tensor(0.02, device=dev)
    vs = torch.tensor(0.03, device=dev)
    cases[name] = lambda M: M.paged_attention(q, kp, vp, table, kv_len, 0.088, ks, vs)


def contig_case(name, B, H, HKV, keys):
    D = 128
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    kc = (torch.randn(B, HKV, keys, D, device=dev) * 2).to(torch.float8_e4m3fn)
    vc = (torch.randn(B, HKV, keys, D, device=dev) * 2).to(torch.float8_e4m3fn)
    valid = torch.rand(B, keys, device=dev) > 0.02
    start = torch.full((B,), keys - 1, device=dev, dtype=torch.int64)
    ks = torch.tensor(0.02, device=dev)
    vs = torch.tensor(0.03, device=dev)
    cases[name] = lambda M: M.attention(q, kc, vc, valid, start, 0.088, ks, vs)


def train_case(name, B, H, HKV, S):
    D = 128
    q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    valid = torch.ones(B, S, device=dev, dtype=torch.bool)
    valid[0, : S // 3] = False
    zero = torch.zeros((), device=dev, dtype=torch.int64)
    lse = torch.empty(H, B * S, device=dev, dtype=torch.float32)

    def f(M):
        out = M.attention(q, k, v, valid, zero, 0.088, lse=lse)
        return torch.cat([out.flatten().float(), lse.flatten()])

    cases[name] = f


for keys in (1024, 2048, 4096):
    paged_case(f"decode 8B paged p16 64 x {keys}", 64, 32, 8, keys, 4608)
paged_case("decode 8B paged p16 64 x 8192", 64, 32, 8, 8192, 8704)
paged_case("decode 8B paged p64 64 x 4096", 64, 32, 8, 4096, 4608, page=64)
paged_case("decode 1.7B paged p16 128 x 640", 128, 16, 8, 640, 1024)
contig_case("decode 8B contiguous 64 x 4096", 64, 32, 8, 4096)
train_case("trainer fwd 8B 4 x 4096", 4, 32, 8, 4096)
train_case("trainer fwd 1.7B 16 x 1024", 16, 16, 8, 1024)
rows = []
print(torch.cuda.get_device_name(), flush=True)
for name, f in cases.items():
    a, b = f(OLD), f(NEW)
    same = torch.equal(
        a.view(torch.int16) if a.dtype == torch.bfloat16 else a, b.view(torch.int16) if b.dtype == torch.bfloat16 else b
    )
    g = {"before": graph(lambda f=f: f(OLD)), "after": graph(lambda f=f: f(NEW))}
    ts = {"before": [], "after": []}
    for r in range(7):
        for v in ("before", "after") if r % 2 == 0 else ("after", "before"):
            for _ in range(5):
                ts[v].append(t(g[v]))
    med = {v: statistics.median(x) for v, x in ts.items()}
    row = dict(
        case=name,
        bits_equal=bool(same),
        before_us=med["before"],
        after_us=med["after"],
        speedup=med["before"] / med["after"],
        before_minmax=f"{min(ts['before']):.1f}-{max(ts['before']):.1f}",
        after_minmax=f"{min(ts['after']):.1f}-{max(ts['after']):.1f}",
    )
    rows.append(row)
    print(
        f"{name:40s} bits {'EQUAL' if same else 'DIFFER'}  before {med['before']:8.1f} us ({row['before_minmax']})  after {med['after']:8.1f} us ({row['after_minmax']})  {row['speedup']:.3f}x",
        flush=True,
    )
    del g
json.dump(
    {"device": torch.cuda.get_device_name(), "rows": rows},
    open(os.path.join(os.environ.get("OUT", "/tmp"), "prefetch_probe.json"), "w"),
    indent=1,
)
