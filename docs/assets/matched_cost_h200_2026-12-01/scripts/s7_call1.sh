#!/usr/bin/env bash
# 2026-12-01 session 7 (2 x H200): the exact mode's sampler (fused draw + exact logprob), the fused norm + FP8 cast
# kept under matched / exact parts over BF16 activations, and the bench's `matched` mode (the user's switch).
# GPU 0: the rollout profile (fast, matched, exact) then the exact / matched GPU tests;
# GPU 1: the GRPO step fast vs matched at the 1.7B shape, then the GRPO / sampler GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s7a; mkdir -p $R
pack() { tar czf $OUT/s7_call1.tgz -C /tmp s7a; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 128 --prompt-len 180 \
    --gen-len 512 --presets jetrl_kv --modes matched exact --profile-steps 3 --out $R/rollout_1p7b.json \
    > $R/rollout_1p7b.log 2>&1
  echo "rollout rc $?" >> $R/rc.txt
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matched_packing_gpu.py \
    tests/gpu/test_batch_invariant_gpu.py > $R/gpu_tests_0.log 2>&1
  echo "tests0 rc $?" >> $R/rc.txt
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 330 python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --prompts 128 --prompt-len 180 \
    --gen-len 512 --micro-batch 4 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
    --out $R/grpo_1p7b.json > $R/grpo_1p7b.log 2>&1
  echo "grpo rc $?" >> $R/rc.txt
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grpo_gpu.py tests/gpu/test_paged_exact_gpu.py \
    tests/gpu/test_fused_rollout_gpu.py tests/gpu/test_continuous_batching_gpu.py -k "not long" > $R/gpu_tests_1.log 2>&1
  echo "tests1 rc $?" >> $R/rc.txt
) &
wait
cat $R/rc.txt
grep -v Warning $R/rollout_1p7b.log | tail -n 45
tail -n 12 $R/grpo_1p7b.log
tail -n 3 $R/gpu_tests_0.log; tail -n 3 $R/gpu_tests_1.log; grep -hE "FAILED|Error" $R/gpu_tests_*.log | head -20
