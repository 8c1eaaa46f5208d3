#!/usr/bin/env bash
# call 3 (2 x H200): one GPU each, side by side, 8 prompts x 8 (the same load a GPU): FP8+KV fast (GPU 0) and
# FP8+KV matched_kernels=auto (GPU 1), 4 steps
CALL=call3; . .gpu/common.sh
build
L=$(( 590 - $(el) ))
run 0 1 _1gpu fp8_kv "grpo.num_prompts_per_step=8" $L & run 1 1 _1gpu fp8_kv_matched "grpo.num_prompts_per_step=8" $L & wait
report
