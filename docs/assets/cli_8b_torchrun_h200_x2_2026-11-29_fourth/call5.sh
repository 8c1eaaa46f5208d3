#!/usr/bin/env bash
# call 5 (2 x H200): GPU tests of the padded cuBLAS pin and the self-check on GPU 1 while GPU 0 builds the 8B
# checkpoint; then the shipped 8B recipe fast (GPU 0) vs matched_kernels=auto (GPU 1), 8 prompts x 8, 4 steps
CALL=call5; . .gpu/common.sh
( CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -n 0 -rs tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_matched_packing_gpu.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $(el) s" ) &
build
wait
tail -15 $R/gpu_tests.log
L=$(( 590 - $(el) ))
run 0 1 _1gpu fp8_kv "grpo.num_prompts_per_step=8" $L & run 1 1 _1gpu fp8_kv_matched "grpo.num_prompts_per_step=8" $L & wait
report
