"""The exact attention kernel compiled for Hopper (sm_90) without a GPU: every variant the exact paths launch (a
contiguous or paged, bf16 or e4m3 cache, packed rows, the trainer's log-sum-exp) at the decode and the trainer's
configuration compiles its two dots (Q.K, P.V) with the same operands' encodings and the same MMA layouts, so the
products inside one MMA instruction come in one order everywhere: the precondition of decode == prefill == training
bitwise, which tests/gpu checks on the hardware (docs/mismatch.md: a kernel whose variants packed their operands
differently was not one bit family)."""

import re

import pytest

triton = pytest.importorskip("triton")

VARIANTS = {  # name: (e4m3 cache, paged, packed rows, writes the log-sum-exp)
    "bf16": (False, False, False, False),
    "paged": (False, True, False, False),
    "e4m3": (True, False, False, False),
    "paged e4m3": (True, True, False, False),
    "trainer lse": (False, False, False, True),
    "packed": (False, False, True, True),
}


def _compile(fp8: bool, paged: bool, varlen: bool, lse: bool, config: tuple[int, int, int]) -> str:
    """The kernel's TTGIR for sm_90 (Triton's own compiler and ptxas; no GPU), Qwen3 heads (2 query heads a KV head,
    head dim 128)."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nemo_jetrl.models import batch_invariant_kernels as K

    kernel = K._attention_kernel
    cache = "*fp8e4nv" if fp8 else "*bf16"
    signature = {"q_ptr": "*bf16", "k_ptr": cache, "v_ptr": cache, "valid_ptr": "*i32" if paged else "*i1",
                 "start_ptr": "*i64", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "out_ptr": "*bf16", "table_ptr": "*i32",
                 "lse_ptr": "*fp32", "cu_ptr": "*i32", "S_q": "i32", "S_k": "i32", "kv_heads": "i32",
                 "sm_scale": "fp32"}  # fmt: skip
    signature |= dict.fromkeys(kernel.arg_names[15:31], "i32")  # the strides
    block_m, warps, stages = config
    constants = dict(N_REP=2, D=128, BLOCK_M=block_m, BLOCK_N=K.ATTN_BLOCK_N, KV_FP8=fp8, DT=tl.bfloat16,
                     HW_CAST=True, PAGE=16 if paged else 1, PAGED=paged, VARLEN=varlen, WRITE_LSE=lse,
                     LEAD_SCAN=1024)  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    source = ASTSource(kernel, signature, {(kernel.arg_names.index(k),): v for k, v in constants.items()})
    options = {"num_warps": warps, "num_stages": stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ttgir"]


def dot_signature(ir: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(each dot's operand and result types without their shapes, whose rows follow the tile; the definitions of
    the MMA and shared-memory layouts they name) of a TTGIR module."""
    dots = re.findall(r"(?:tt\.dot|ttng\.warp_group_dot) .*? : ((?:tensor|!ttg).*?)(?: loc\(|$)", ir, flags=re.M)
    dots = [re.sub(r"(tensor|memdesc)<\d+x\d+x", r"\1<", d) for d in dots]
    layouts = re.findall(r"^(#(?:mma|shared)\d* = .*)$", ir, flags=re.M)
    return tuple(dots), tuple(sorted(layouts))


def test_every_variant_compiles_its_dots_alike():
    from nemo_jetrl.models import batch_invariant_kernels as K

    seen = {}
    for config in (K.DECODE_CONFIG, (K.ATTN_BLOCK_M, K.ATTN_WARPS, K.ATTN_STAGES)):
        for name, args in VARIANTS.items():
            seen[(config, name)] = dot_signature(_compile(*args, config))
    dots, layouts = seen[(K.DECODE_CONFIG, "bf16")]
    assert len(dots) == 2 and any("mma" in x for x in layouts), (dots, layouts)  # Q.K and P.V, on tensor cores
    odd = {key: sig for key, sig in seen.items() if sig != (dots, layouts)}
    assert not odd, {"reference": (dots, layouts), "different": odd}
