#!/usr/bin/env bash
# 2026-12-01 session 8 (2 x H200): the exact decode's per-layout pipeline depth (contiguous 4 stages, paged 2).
# GPU 0: the matched rollout at the 8K batch (paged), then the GRPO step fast vs matched at the 1.7B shape;
# GPU 1: the GPU tests of the exact and matched paths.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8; mkdir -p $R
pack() { tar czf $OUT/s8_call5.tgz -C /tmp s8; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 260 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 32 --prompt-len 7680 \
    --gen-len 512 --presets jetrl_kv --modes matched --profile-steps 3 --out $R/rollout_8k.json > $R/rollout_8k.log 2>&1
  echo "rollout8k rc $?" >> $R/rc.txt
  timeout 290 python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --prompts 128 --prompt-len 180 \
    --gen-len 512 --micro-batch 4 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
    --out $R/grpo_1p7b.json > $R/grpo_1p7b.log 2>&1
  echo "grpo rc $?" >> $R/rc.txt
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 260 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_batch_invariant_gpu.py \
    tests/gpu/test_paged_exact_gpu.py tests/gpu/test_matched_packing_gpu.py > $R/gpu_tests_0.log 2>&1
  echo "tests0 rc $?" >> $R/rc.txt
  timeout 270 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grpo_gpu.py tests/gpu/test_fused_rollout_gpu.py \
    tests/gpu/test_continuous_batching_gpu.py -k "not long" > $R/gpu_tests_1.log 2>&1
  echo "tests1 rc $?" >> $R/rc.txt
) &
wait
cat $R/rc.txt; tail -n 3 $R/gpu_tests_*.log; grep -E "rollout|x\)|ratio" $R/rollout_8k.log | head; tail -n 6 $R/grpo_1p7b.log
