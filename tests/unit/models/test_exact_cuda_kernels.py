"""The CUDA exact kernels (`models/exact_decode_cuda.py`, `models/exact_train_cuda.py`) without a GPU: their sources
compile (NVRTC, sm_90) to the arithmetic the Triton exact kernel's sm_90 PTX has, and that PTX still has it (a Triton
upgrade that changed the exp, the contraction of the per-slot sums, the reduction trees, the output's accumulation
or the division would break the bit equality, which the GPU tests and the start-up comparison check on the
hardware); the dispatch's rules."""

import ctypes
import re
from pathlib import Path

import pytest
import torch

from nemo_jetrl.models import exact_cuda_choice, exact_decode_cuda, exact_train_cuda

LOG2E = "0f3FB8AA3B"  # float32 log2(e), the constant of Triton's exp


def _nvrtc_ptx(source: str) -> str:
    """PTX of `source` for compute_90 from the NVRTC library torch's CUDA wheels bring (skip without it)."""
    nvidia = pytest.importorskip("nvidia")
    libs = [p for d in nvidia.__path__ for p in Path(d).glob("cu*/lib/libnvrtc.so*")]
    if not libs:
        pytest.skip("no NVRTC library in this environment")
    lib = ctypes.CDLL(str(libs[0]))
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
    rc = lib.nvrtcCompileProgram(prog, 1, opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert rc == 0, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def _triton_asm(train: bool = False) -> dict[str, str]:
    """The Triton exact kernel for sm_90, 4 query heads a KV head: the paged e4m3 decode (one program a chunk), or
    (train) the trainer's packed forward with the log-sum-exp."""
    triton = pytest.importorskip("triton")
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nemo_jetrl.models import batch_invariant_kernels as K

    kernel = K._attention_kernel
    signature = {"q_ptr": "*bf16", "k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv", "valid_ptr": "*i32", "start_ptr": "*i64",
                 "ks_ptr": "*fp32", "vs_ptr": "*fp32", "out_ptr": "*bf16", "table_ptr": "*i32", "lse_ptr": "*fp32",
                 "cu_ptr": "*i32", "S_q": "i32", "S_k": "i32", "kv_heads": "i32", "sm_scale": "fp32"}  # fmt: skip
    signature |= dict.fromkeys(kernel.arg_names[15:31], "i32") | {"part_ptr": "*fp32"}
    block_m, warps, stages = K.TRAIN_CONFIG if train else K.decode_config(torch.bfloat16, paged=True)
    constants = dict(N_REP=4, D=128, BLOCK_M=block_m, BLOCK_N=K.ATTN_BLOCK_N, SPLIT_N=K.ATTN_SPLIT_KEYS,
                     KV_FP8=not train, DT=tl.bfloat16, HW_CAST=True, PAGE=1 if train else 16, PAGED=not train,
                     VARLEN=train, WRITE_LSE=train, SPLIT_OUT=not train, LEAD_SCAN=1024)  # fmt: skip
    if train:
        signature |= {"k_ptr": "*bf16", "v_ptr": "*bf16"}
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items() if "*" in t}
    source = ASTSource(kernel, signature | dict.fromkeys(constants, "constexpr"),
                       {(kernel.arg_names.index(k),): v for k, v in constants.items()}, attrs)  # fmt: skip
    options = dict(num_warps=warps, num_stages=stages, maxnreg=None if train else K.decode_maxnreg(torch.bfloat16))
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm


def _shuffle_offsets(ptx: str) -> list[int]:
    return [int(x) for x in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),", ptx)]


def test_the_triton_kernel_still_has_the_arithmetic_the_cuda_kernel_repeats():
    asm = _triton_asm()
    ptx, ttgir = asm["ptx"], asm["ttgir"]
    # exp: mul.f32 by log2(e), then ex2.approx.f32 without flushing subnormals
    assert re.search(rf"mul\.f32\s+(%r\d+), %r\d+, {LOG2E};\s*\n\s*ex2\.approx\.f32\s+%r\d+, \1;", ptx)
    assert "ex2.approx.ftz" not in ptx and ".ftz" not in ptx
    # the per-slot sums fma(l, alpha, p): one per score element a thread holds (64 keys x 16 query rows / 128)
    assert ptx.count("fma.rn.f32") == 64 * 16 // 128
    # the chunk's sum over the slots: in-warp butterflies 16, 8, 4 (for each of a thread's 4 query columns), then
    # the 4 warps' partials 2, 1; the block max's butterflies come first and in the same order
    offsets = _shuffle_offsets(ptx)
    assert offsets[-14:] == [16, 8, 4] * 4 + [2, 1]
    # the output's dot accumulates onto the rescaled accumulator (acc * alpha), which the CUDA kernel's MMA chain
    # starts from
    dots = re.findall(r"ttng\.warp_group_dot (%\S+), (%\S+), (%\S+) ", ttgir)
    assert len(dots) == 2
    acc_def = re.search(rf"{re.escape(dots[1][2])} = (\S+)", ttgir).group(1)
    assert acc_def == "arith.mulf"


def test_the_cuda_source_compiles_to_that_arithmetic():
    ptx = _nvrtc_ptx(exact_decode_cuda.kernel_source())
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 16  # 8 score steps, 2 x 4 output
    assert ptx.count("fma.rn.f32") == 4  # the per-slot sums only: nothing else contracted
    # exp: a round-to-nearest multiply by log2(e) (NVRTC moves the constant into a register first), then
    # ex2.approx.f32 without flushing subnormals: 2 alphas and 4 p's a block
    assert len(re.findall(rf"mov\.f32\s+%f\d+, {LOG2E};", ptx)) == 6
    assert ptx.count("ex2.approx.f32") == 6 and ".ftz" not in ptx
    assert "cvt.rn.bf16x2.f32" in ptx and "cvt.rn.f16x2.e4m3x2" in ptx
    assert ptx.count("shfl.sync.bfly.b32") == 12  # the block max and the chunk's sum: 3 butterflies x 2 columns


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_every_stage_count_compiles(stages):
    assert "cp.async.wait_group" in _nvrtc_ptx(exact_decode_cuda.kernel_source(stages=stages, min_blocks=4))


def test_the_dispatch_rules():
    q = torch.zeros(2, 8, 1, 128, dtype=torch.bfloat16)
    cache = torch.zeros(2, 2, 64, 128).to(torch.float8_e4m3fn)
    assert "CUDA" in exact_decode_cuda.kernel_problem(q, cache, cache, None)
    assert not exact_cuda_choice.takes_cuda(q, cache, cache, None, paged=True)  # a CPU tensor
    assert not exact_cuda_choice.takes_cuda(q, cache.bfloat16(), cache.bfloat16(), None, paged=True)  # bf16 cache
    assert exact_decode_cuda.shared_bytes(3) == 3 * 16384 + 1024 + 128 + 16


def test_the_triton_trainer_forward_still_has_the_arithmetic_the_cuda_kernel_repeats():
    ptx = _triton_asm(train=True)["ptx"]
    assert re.search(rf"mul\.f32\s+(%r\d+), %r\d+, {LOG2E};\s*\n\s*ex2\.approx\.f32\s+%r\d+, \1;", ptx)
    assert ptx.count("fma.rn.f32") == 64 * 64 // 128  # the per-slot sums only (the log's are .ftz)
    assert ptx.count("div.full.f32") == 128 * 64 // 128  # the output's division
    assert ptx.count("mul.rn.f32") >= 2 * 128 * 64 // 128  # the chunks' merge: each product rounded on its own
    # the block max, then the chunk's slot sum: in-warp butterflies 16, 8, 4 per query column, the warps' 2, 1
    assert _shuffle_offsets(ptx)[-52:] == [16, 8, 4] * 16 + [2, 1, 2, 1]


def test_the_cuda_trainer_forward_compiles_to_that_arithmetic():
    ptx = _nvrtc_ptx(exact_train_cuda.kernel_source(split=1024))
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 128  # 64 score and 64 output steps
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == 32  # V as the B operand of P . V
    assert ptx.count("div.full.f32") == 64 and ".ftz" not in ptx
    # the block's softmax step twice (masked, and unmasked for a block every row sees whole): exp, 32 p's and 2
    # alphas each, and 2 x 2 merge weights a chunk; nothing but the slot sums (and logf's polynomial) contracted
    assert ptx.count("ex2.approx.f32") == 2 * 34 + 4
    fma = ptx.count("fma.rn.f32")
    assert 2 * 32 < fma <= 2 * 32 + 2 * 14
    # the block max (2 rows x xor 1, 2, in each softmax step) and the chunk's tree (2 rows x 4 key groups x 2 slot
    # parities x xor 2, 1)
    assert ptx.count("shfl.sync.bfly.b32") == 2 * 4 + 32
    assert exact_train_cuda.shared_bytes() == 2 * 32768 + 32768 + 16


def test_the_trainer_dispatch_rules():
    q = torch.zeros(1, 8, 64, 128, dtype=torch.bfloat16)
    kv = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)
    assert "CUDA" in exact_train_cuda.kernel_problem(q, kv, kv)
    assert not exact_cuda_choice.train_serves(q, kv, kv, packed=True)
