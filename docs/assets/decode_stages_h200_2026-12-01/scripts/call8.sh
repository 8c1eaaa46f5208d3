#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): the landed configs (contiguous decode 3 stages, paged 2): the matched rollout at
# the 8K batch over the static batch's contiguous cache, then the GRPO step fast vs matched at the 1.7B shape.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8d; mkdir -p $R
pack() { tar czf $OUT/s8_call8.tgz -C /tmp s8d; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 200 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 32 --prompt-len 7680 \
  --gen-len 512 --presets jetrl_kv --modes matched --out $R/rollout_8k.json > $R/rollout_8k.log 2>&1
echo "rollout8k rc $?" >> $R/rc.txt
timeout 270 python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --prompts 128 --prompt-len 180 \
  --gen-len 512 --micro-batch 4 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
  --out $R/grpo_1p7b.json > $R/grpo_1p7b.log 2>&1
echo "grpo rc $?" >> $R/rc.txt
cat $R/rc.txt; tail -n 6 $R/rollout_8k.log; tail -n 4 $R/grpo_1p7b.log
