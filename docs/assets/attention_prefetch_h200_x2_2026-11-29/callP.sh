#!/usr/bin/env bash
# call P (2 x H200): the exact attention with one-block-ahead loads: before/after probe + bench (GPU 0) while GPU 1
# runs the exact paths' GPU tests; then GPU 0 builds the 8B checkpoint for the next call
CALL=callP; . .gpu/common.sh
( CUDA_VISIBLE_DEVICES=1 timeout 330 python3 -m pytest -q -p no:cacheprovider -n 0 -rs tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_matched_packing_gpu.py tests/gpu/test_paged_exact_gpu.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $(el) s" ) &
CUDA_VISIBLE_DEVICES=0 OUT=$R timeout 150 python3 .gpu/prefetch_probe.py > $R/prefetch_probe.log 2>&1; echo "probe rc=$? at $(el) s"; cat $R/prefetch_probe.log | tail -14
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.bench_batch_invariant_kernels --shapes --configs 16,4,2 16,2,3 16,8,3 32,4,3 --out $R/bi_prefetch.json > $R/bench.log 2>&1; echo "bench rc=$? at $(el) s"
grep -vE "^\{" $R/bench.log | tail -45
build
wait
grep -E "passed|failed|FAILED|Error" $R/gpu_tests.log | head -20
