#!/usr/bin/env bash
# call 2 (2 x H200): BF16 DP=2 under torchrun, same load; then the torchrun GPU test if time is left
CALL=call2; . .gpu/common.sh
build
run 0,1 2 _dp2 bf16 "grpo.num_prompts_per_step=16" $(( 590 - $(el) ))
[ $(el) -lt 480 ] && { timeout $(( 590 - $(el) )) python3 -m pytest -q -p no:cacheprovider -n 0 tests/gpu/test_torchrun_gpu.py > $R/torchrun_gpu_test.log 2>&1; echo "torchrun gpu test rc=$? at $(el) s"; tail -3 $R/torchrun_gpu_test.log; }
report
