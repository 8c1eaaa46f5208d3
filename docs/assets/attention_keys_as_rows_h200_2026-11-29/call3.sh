#!/bin/bash
# call 3: bench_grpo_step matched vs fast, variants resident and alternating, 5 timed steps (8B x 8 layers, 1.7B)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 270 python3 -m benchmarks.bench_grpo_step --shape qwen3-8b --layers 8 --prompts 64 --prompt-len 256 --gen-len 768 --micro-batch 8 --warmup 1 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing --out $OUT/grpo_step_matched_8b_l8.json 2>&1 | grep -v "^{" | tail -25
timeout 290 python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --prompts 128 --prompt-len 180 --gen-len 512 --micro-batch 4 --warmup 1 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing --out $OUT/grpo_step_matched_1p7b.json 2>&1 | grep -v "^{" | tail -25
