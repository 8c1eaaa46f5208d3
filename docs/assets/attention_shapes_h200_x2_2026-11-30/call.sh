#!/usr/bin/env bash
# issue 44 (1 x H200): the exact attention against the fast kernels at the 1.7B / 8B shapes, the 1.7B 8K CLI batch
# included (32 x 4,096 / 8,192 keys), bf16-cache row = the e4m3 widening's cost; ~3-4 min
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 560 python3 -m benchmarks.bench_batch_invariant_kernels --shapes --out $OUT/bi_shapes.json 2>&1 | tail -80
