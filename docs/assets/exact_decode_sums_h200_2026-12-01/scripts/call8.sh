#!/usr/bin/env bash
# 2026-12-01 session 9 (1 x H200): the paged decode with a 128-register budget (probe 8), the GPU tests of the paged /
# exact / continuous-batching paths, then the 8B-shape GRPO step fast vs matched (performance.md's command).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s9c8; mkdir -p $R
pack() { cp $0 $R/; tar czf $OUT/s9_call8.tgz -C /tmp s9c8; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 100 python3 .gpu/probe8.py > $R/probe8.log 2>&1; echo "probe8 rc $?" >> $R/rc.txt
grep -v -i warn $R/probe8.log | cut -c1-330
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_paged_exact_gpu.py tests/gpu/test_continuous_batching_gpu.py \
  tests/gpu/test_fused_rollout_gpu.py > $R/gpu_tests.log 2>&1; echo "tests rc $?" >> $R/rc.txt
grep -E "FAILED|ERROR" $R/gpu_tests.log | head; tail -n 1 $R/gpu_tests.log
timeout 220 python3 -m benchmarks.bench_grpo_step --shape qwen3-8b --layers 8 --prompts 64 --prompt-len 256 \
  --gen-len 768 --micro-batch 8 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
  --out $R/grpo_8b.json > $R/grpo_8b.log 2>&1; echo "grpo8b rc $?" >> $R/rc.txt
cat $R/rc.txt; tail -n 4 $R/grpo_8b.log
