#!/usr/bin/env bash
# call 6 (2 x H200): FP8+KV DP=2 under torchrun (16 prompts x 8, 4 steps), then the torchrun GPU test
CALL=call6; . .gpu/common.sh
build
run 0,1 2 _dp2 fp8_kv "grpo.num_prompts_per_step=16" $(( 470 - $(el) ))
timeout $(( 590 - $(el) )) python3 -m pytest -q -p no:cacheprovider -n 0 tests/gpu/test_torchrun_gpu.py > $R/torchrun_gpu_test.log 2>&1; echo "torchrun gpu test rc=$? at $(el) s"; tail -3 $R/torchrun_gpu_test.log
report
