import torch

from benchmarks import bench_batch_invariant_kernels as B
from benchmarks.common import alternating_rounds, device_info

print(device_info(torch.device("cuda")))
for label, bsz, heads, n in B.SHAPE_TRAIN:
    variants = B._shape_variants(torch.device("cuda"), False, bsz, heads, n)
    times = {k: [] for k in variants}
    for _, order in alternating_rounds(list(variants), 5):
        for name in order:
            times[name].append(1000 * B.bench(variants[name]))
    for name, t in times.items():
        t = sorted(t)
        print(f"{label}: {name}: median {t[2]:.1f} us (min {t[0]:.1f}, max {t[-1]:.1f})", flush=True)
