#!/usr/bin/env bash
# call 1 (2 x H200): build random Qwen3-8B (36 layers); FP8+KV DP=2 under torchrun, 16 prompts x 8, 4 steps
CALL=call1; . .gpu/common.sh
build
run 0,1 2 _dp2 fp8_kv "grpo.num_prompts_per_step=16" $(( 590 - $(el) ))
report
