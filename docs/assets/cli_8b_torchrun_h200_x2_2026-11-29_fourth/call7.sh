#!/usr/bin/env bash
# call 7 (2 x H200): BF16 DP=2 under torchrun, same load as call 6 (16 prompts x 8, 4 steps)
CALL=call7; . .gpu/common.sh
build
run 0,1 2 _dp2 bf16 "grpo.num_prompts_per_step=16" $(( 580 - $(el) ))
report
