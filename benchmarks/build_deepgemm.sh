#!/usr/bin/env bash
# Build DeepGEMM's host extension from a source tree, for benchmarks/bench_deepgemm.py (an optional third-party
# FP8 GEMM library: never vendored here; MIT, its CUTLASS headers BSD-3, fmt MIT).
#
#   bash benchmarks/build_deepgemm.sh SRC_DIR      # then: export PYTHONPATH=SRC_DIR:$PYTHONPATH
#
# SRC_DIR: DeepGEMM at 54e22612409371d6364144b69086735beb54e98b (v2.6.1) with its header-only dependencies in
# third-party/cutlass/include (NVIDIA/cutlass f3fde583, v4.2.1) and third-party/fmt/include (fmtlib/fmt 553ec11e),
# e.g. from clones of the three repositories (2.7 MB as a .tar.gz, which is how it travels to a GPU box):
#   git -C DeepGEMM archive 54e2261 | tar x -C SRC_DIR
#   git -C cutlass archive f3fde583 include | tar x -C SRC_DIR/third-party/cutlass
#   git -C fmt archive 553ec11e include | tar x -C SRC_DIR/third-party/fmt
# Needs nvcc >= 12.3 (its kernels are compiled at first use; cache in $DG_JIT_CACHE_DIR), g++ and torch's headers.
# Built with torch.utils.cpp_extension (DeepGEMM's setup.py needs `wheel` / `packaging`), and with libstdc++ linked
# statically and hidden (`-Wl,--exclude-libs,ALL`): linked against the shared one, the extension's std::regex crashed
# (SIGSEGV in its include parser, torch 2.11 / g++ 13.3 / nvcc 13.0 on an H100 box, 2026-11-26).
set -euo pipefail
SRC=$(realpath "${1:?usage: bash benchmarks/build_deepgemm.sh SRC_DIR}")
[ -f "$SRC/csrc/python_api.cpp" ] || { echo "error: $SRC is not a DeepGEMM source tree" >&2; exit 2; }
[ -d "$SRC/third-party/cutlass/include/cute" ] || { echo "error: $SRC/third-party/cutlass/include missing" >&2; exit 2; }
cp -r "$SRC/third-party/cutlass/include/cute" "$SRC/third-party/cutlass/include/cutlass" "$SRC/deep_gemm/include/"
cd "$SRC"
python3 - <<'PY'
import time

import torch
from torch.utils.cpp_extension import CUDA_HOME, load

start = time.time()
load(
    "_C", ["csrc/python_api.cpp"], build_directory="deep_gemm",
    extra_cflags=["-O3", "-std=c++17", "-Wno-psabi", "-Wno-deprecated-declarations",
                  f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"],
    extra_include_paths=[f"{CUDA_HOME}/include", f"{CUDA_HOME}/include/cccl", "deep_gemm/include",
                         "third-party/cutlass/include", "third-party/fmt/include"],
    extra_ldflags=[f"-L{CUDA_HOME}/lib64", "-lcudart", "-lnvrtc", "-static-libstdc++", "-static-libgcc",
                   "-Wl,--exclude-libs,ALL"],
)
print(f"deep_gemm host extension built in {time.time() - start:.0f} s: export PYTHONPATH={__import__('os').getcwd()}")
PY
