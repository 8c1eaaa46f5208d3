#!/usr/bin/env bash
# 2026-12-01 session 7 (1 x H200): the GRPO step, fast vs matched (alternating, 5 timed steps), at the 1.7B shape
# (the shipped 1.7B recipe's batch) and at the 8B shape (8 layers, 64 x 768 tokens), on a fresh machine.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s7d; mkdir -p $R
pack() { tar czf $OUT/s7_call4.tgz -C /tmp s7d; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 290 python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --prompts 128 --prompt-len 180 \
  --gen-len 512 --micro-batch 4 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
  --out $R/grpo_1p7b.json > $R/grpo_1p7b.log 2>&1
echo "1.7B rc $?"
timeout 280 python3 -m benchmarks.bench_grpo_step --shape qwen3-8b --layers 8 --prompts 64 --prompt-len 256 \
  --gen-len 768 --micro-batch 8 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
  --out $R/grpo_8b.json > $R/grpo_8b.log 2>&1
echo "8B rc $?"
tail -n 5 $R/grpo_1p7b.log; tail -n 5 $R/grpo_8b.log
