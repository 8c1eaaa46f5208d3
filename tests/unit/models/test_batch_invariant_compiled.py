"""The exact attention kernel compiled for Hopper (sm_90) without a GPU: every variant the exact paths launch (a
contiguous or paged, bf16 or e4m3 cache, packed rows, the trainer's log-sum-exp) at the decode and the trainer's
configuration compiles its two dots (Q.K, P.V) with the same operands' encodings and the same MMA layouts, so the
products inside one MMA instruction come in one order everywhere: the precondition of decode == prefill == training
bitwise, which tests/gpu checks on the hardware (docs/mismatch.md: a kernel whose variants packed their operands
differently was not one bit family). Compiled as a launch specializes it: 16-byte aligned pointers and head-dim
strides (the compiler vectorizes, and lays out, on them)."""

import re

import pytest

triton = pytest.importorskip("triton")

VARIANTS = {  # name: (e4m3 cache, paged, packed rows, writes the log-sum-exp, one program a chunk of keys)
    "bf16": (False, False, False, False, False),
    "paged": (False, True, False, False, False),
    "e4m3": (True, False, False, False, False),
    "paged e4m3": (True, True, False, False, False),
    "trainer lse": (False, False, False, True, False),
    "packed": (False, False, True, True, False),
    "e4m3 chunks": (True, False, False, False, True),
    "paged e4m3 chunks": (True, True, False, False, True),
}


def _compile(fp8: bool, paged: bool, varlen: bool, lse: bool, split: bool, config: tuple[int, int, int]) -> str:
    """The kernel's TTGIR for sm_90 (Triton's own compiler and ptxas; no GPU), Qwen3 heads (2 query heads a KV head,
    head dim 128)."""
    import triton.language as tl

    from nemo_jetrl.models import batch_invariant_kernels as K

    kernel = K._attention_kernel
    cache = "*fp8e4nv" if fp8 else "*bf16"
    signature = {"q_ptr": "*bf16", "k_ptr": cache, "v_ptr": cache, "valid_ptr": "*i32" if paged else "*i1",
                 "start_ptr": "*i64", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "out_ptr": "*bf16", "table_ptr": "*i32",
                 "lse_ptr": "*fp32", "cu_ptr": "*i32", "S_q": "i32", "S_k": "i32", "kv_heads": "i32",
                 "sm_scale": "fp32"}  # fmt: skip
    signature |= dict.fromkeys(kernel.arg_names[15:31], "i32") | {"part_ptr": "*fp32"}  # strides, chunk states
    block_m, warps, stages = config
    constants = dict(N_REP=2, D=128, BLOCK_M=block_m, BLOCK_N=K.ATTN_BLOCK_N, SPLIT_N=K.ATTN_SPLIT_KEYS, KV_FP8=fp8,
                     DT=tl.bfloat16, HW_CAST=True, PAGE=16 if paged else 1, PAGED=paged, VARLEN=varlen,
                     WRITE_LSE=lse, SPLIT_OUT=split, LEAD_SCAN=1024)  # fmt: skip
    aligned = [name for name, kind in signature.items() if kind.startswith("*")]  # torch's allocations
    aligned += [f"s{t}{dim}" for t in "qkvo" for dim in "bhs"]  # q / cache / output strides: multiples of D
    return compile_sm90(kernel, signature, constants, tuple(aligned), num_warps=warps, num_stages=stages)


def compile_sm90(kernel, signature: dict[str, str], constants: dict, divisible: tuple[str, ...] = (), **options) -> str:
    """`kernel`'s TTGIR for Hopper (sm_90) from Triton's own compiler, no GPU: `signature` the runtime arguments'
    types, `constants` the constexpr arguments' values, `divisible` the arguments a launch specializes as multiples
    of 16 (a 16-byte aligned pointer, an integer such as a row width; the compiler vectorizes on it), `options` the
    launch's (num_warps, num_stages)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    signature = signature | dict.fromkeys(constants, "constexpr")
    source = ASTSource(kernel, signature, {(kernel.arg_names.index(k),): v for k, v in constants.items()}, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ttgir"]


def dot_signature(ir: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(each dot's operand and result types without their shapes, which follow the tile; the definitions of the
    MMA and shared-memory layouts the dots name, without what follows the tile's width: the MMA instruction's N
    (the query rows) and the shared-memory swizzle width) of a TTGIR module. Buffers no dot reads (a paged
    variant's pipelined block-table loads) are left out."""
    dots = re.findall(r"(?:tt\.dot|ttng\.warp_group_dot) .*? : ((?:tensor|!ttg).*?)(?: loc\(|$)", ir, flags=re.M)
    dots = [re.sub(r"(tensor|memdesc)<\d+x\d+x", r"\1<", d) for d in dots]
    defined = dict(re.findall(r"^(#(?:mma|shared)\d*) = (.*)$", ir, flags=re.M))
    named = {name for d in dots for name in re.findall(r"#(?:mma|shared)\d*\b", d)}  # the layouts the dots read
    layouts = [defined[name] for name in sorted(named) if name in defined]
    layouts = [re.sub(r"instrShape = \[(\d+), \d+, (\d+)\]", r"instrShape = [\1, N, \2]", x) for x in layouts]
    layouts = [re.sub(r"swizzlingByteWidth = \d+", "swizzlingByteWidth = W", x) for x in layouts]
    return tuple(re.sub(r"#shared\d*", "#shared", d) for d in dots), tuple(sorted(set(layouts)))


def test_every_variant_compiles_its_dots_alike():
    from nemo_jetrl.models import batch_invariant_kernels as K

    seen = {}
    for config in (K.DECODE_CONFIG, K.PAGED_DECODE_CONFIG, K.TRAIN_CONFIG):
        for name, args in VARIANTS.items():
            seen[(config, name)] = dot_signature(_compile(*args, config))
    dots, layouts = seen[(K.DECODE_CONFIG, "bf16")]
    assert len(dots) == 2 and any("versionMajor = 3" in x for x in layouts), (dots, layouts)  # two wgmma dots
    odd = {key: sig for key, sig in seen.items() if sig != (dots, layouts)}
    assert not odd, {"reference": (dots, layouts), "different": odd}


def test_the_signature_tells_operand_encodings_apart():
    """A dot whose A operand is read from shared memory instead of registers is told apart (the check can fail)."""
    ir = "%1 = ttng.warp_group_dot %a, %b : tensor<64x128xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> * !ttg.memdesc<128x16xbf16, #shared1, #smem> -> tensor<64x16xf32, #mma>\n#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 1], instrShape = [16, 16, 16]}>\n"  # noqa: E501
    same_but_wider = ir.replace("64x16xf32", "64x64xf32").replace("128x16xbf16", "128x64xbf16").replace(
        "[16, 16, 16]", "[16, 64, 16]")  # fmt: skip
    from_smem = ir.replace("tensor<64x128xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>>",
                           "!ttg.memdesc<64x128xbf16, #shared, #smem>")  # fmt: skip
    kwidth4 = ir.replace("kWidth = 2", "kWidth = 4")
    assert dot_signature(same_but_wider) == dot_signature(ir)
    assert dot_signature(from_smem) != dot_signature(ir)
    assert dot_signature(kwidth4) != dot_signature(ir)
