"""Compile the exact attention kernel for sm_90 without a GPU and count its PTX loads (docs/mismatch.md, the
correction of "Where the exact decode's time goes").

    uv run python docs/assets/attention_tiles_h200_x2_2026-11-30/compile_sm90.py paged 16,4,3 --split
    uv run python docs/assets/attention_tiles_h200_x2_2026-11-30/compile_sm90.py contig 64,4,3 --bf16-kv

Integer arguments are marked divisible by 16 as Triton's launcher marks them at run time (`--no-divisibility`:
pointers only). Prints the loads by kind and the `cp.async` copies (a pipelined loop issues its loads as these);
the PTX goes to --ptx for ptxas (`ptxas -arch=sm_90a -v FILE` gives registers and spills).
"""

import argparse
import re
from collections import Counter

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import nemo_jetrl.models.batch_invariant_kernels as K

STRIDES = ("sqb", "sqh", "sqs", "skb", "skh", "sks", "svb", "svh", "svs", "sob", "soh", "sos", "stable")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("layout", choices=("paged", "contig"))
    p.add_argument("config", help="query rows, warps, stages, e.g. 16,4,3")
    p.add_argument("--split", action="store_true", help="a decode step's chunk programs (SPLIT_OUT)")
    p.add_argument("--bf16-kv", action="store_true", help="bf16 K/V (the trainer's) instead of an e4m3 cache")
    p.add_argument("--no-divisibility", action="store_true")
    p.add_argument("--ptx", default="/tmp/attention_sm90.ptx")
    args = p.parse_args()
    paged, (block_m, warps, stages) = args.layout == "paged", (int(x) for x in args.config.split(","))
    kv = "*bf16" if args.bf16_kv else "*fp8e4nv"
    ptrs = {"q_ptr": "*bf16", "k_ptr": kv, "v_ptr": kv, "valid_ptr": "*i32" if paged else "*i1", "start_ptr": "*i64",
            "ks_ptr": "*fp32", "vs_ptr": "*fp32", "out_ptr": "*bf16", "table_ptr": "*i32", "lse_ptr": "*i64",
            "cu_ptr": "*i64", "part_ptr": "*fp32"}  # fmt: skip
    const = dict(N_REP=4, D=128, BLOCK_M=block_m, BLOCK_N=K.ATTN_BLOCK_N, SPLIT_N=K.ATTN_SPLIT_KEYS,
                 KV_FP8=not args.bf16_kv, DT=tl.bfloat16, HW_CAST=True, PAGE=16 if paged else 1, PAGED=paged,
                 VARLEN=False, WRITE_LSE=False, SPLIT_OUT=args.split, LEAD_SCAN=1024)  # fmt: skip
    names = K._attention_kernel.arg_names
    sig = {n: "constexpr" if n in const else ptrs.get(n, "fp32" if n == "sm_scale" else "i32") for n in names}
    marked = set(ptrs) | (set() if args.no_divisibility else set(STRIDES))
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in marked}
    src = ASTSource(K._attention_kernel, sig, constexprs=const, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    ptx = kernel.asm["ptx"]
    with open(args.ptx, "w") as f:
        f.write(ptx)
    loads = Counter(re.findall(r"\b(ld\.global[.\w]*|cp\.async\.c[ag][.\w]*)", ptx))
    print(f"triton {triton.__version__}, {vars(args)}: {dict(loads)}; wait_group: {ptx.count('cp.async.wait_group')}")


if __name__ == "__main__":
    main()
