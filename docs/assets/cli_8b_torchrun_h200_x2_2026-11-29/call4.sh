#!/usr/bin/env bash
# call 4 (2 x H200): FP8+KV TP=2 under torchrun, 8 prompts x 8 (one TP group: the one-GPU load), 4 steps
CALL=call4; . .gpu/common.sh
build
run 0,1 2 _tp2 fp8_kv "grpo.num_prompts_per_step=8 policy.dtensor_cfg.tensor_parallel_size=2" $(( 470 - $(el) ))
report
