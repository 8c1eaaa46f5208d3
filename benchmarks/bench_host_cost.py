"""Host time per call of the launches an FP8 linear makes, against BF16's GEMM (GPU only).

    python3 -m benchmarks.bench_host_cost

A long sleep kernel keeps the device busy while each call runs `--calls` times, so no call waits for the device:
the wall time per call is what the host spends launching it. Prints the median of `--repeats` such loops, in us.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from nemo_jetrl.precision.gemm import fp8_blockwise_mm
from nemo_jetrl.precision.kernels import triton_quant
from nemo_jetrl.precision.quant import act_quant, act_quant_dual, weight_quant


def host_us(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of device work queued first: the launches below never wait
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    per_call = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return per_call


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--features", type=int, default=4096)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_host_cost needs a CUDA device")
        return 1
    m, k, n = args.tokens, args.features, args.features
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)  # x: [M, K]
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # w: [N, K]
    xq, xs = act_quant(x)
    wq, ws = weight_quant(w)
    st = F.ScalingType
    cases = {
        "torch.mm (bf16)": lambda: torch.mm(x, w.t()),
        "F.scaled_mm blockwise": lambda: F.scaled_mm(
            xq, wq.t(), xs, st.BlockWise1x128, ws.t(), st.BlockWise128x128, output_dtype=torch.bfloat16
        ),
        "torch._scaled_mm blockwise": lambda: torch._scaled_mm(
            xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16
        ),
        "fp8_blockwise_mm": lambda: fp8_blockwise_mm(xq, xs, wq, ws),
        "Triton quant_groups launch": lambda: triton_quant.quant_groups(x, 128, False),
        "act_quant": lambda: act_quant(x),
        "act_quant_dual": lambda: act_quant_dual(x),
        "torch.empty": lambda: torch.empty(m, k, device="cuda"),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: host us per call, [{m} x {k}] operands")
    for name, fn in cases.items():
        try:
            runs = [host_us(fn, args.calls) for _ in range(args.repeats)]
            print(f"  {name:<30} {statistics.median(runs):7.1f} us  (min {min(runs):.1f}, max {max(runs):.1f})")
        except (RuntimeError, TypeError, ValueError) as e:  # an API this torch lacks
            print(f"  {name:<30} failed: {type(e).__name__}: {str(e)[:120]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
