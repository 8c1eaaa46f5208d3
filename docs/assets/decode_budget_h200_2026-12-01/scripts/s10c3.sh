#!/usr/bin/env bash
# 2026-12-01 session 10 call 3: the decode within 128 registers at 3 stages (working tree): GPU tests of the exact
# paths, then the 1.7B-shape GRPO step fast vs matched (performance.md's command).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c3; mkdir -p $R
pack() { cp $0 $R/; tar czf $OUT/s10_call3.tgz -C /tmp s10c3; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_paged_exact_gpu.py \
  tests/gpu/test_matched_packing_gpu.py tests/gpu/test_grpo_gpu.py::test_small_qwen3_exact_mode_fp8_kv_is_exact_at_another_micro_batch \
  > $R/gpu_tests.log 2>&1; echo "tests rc $?" >> $R/rc.txt
grep -E "FAILED|ERROR" $R/gpu_tests.log | head; tail -n 1 $R/gpu_tests.log
timeout 280 python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --prompts 128 --prompt-len 180 \
  --gen-len 512 --micro-batch 4 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
  --out $R/grpo_1p7b.json > $R/grpo_1p7b.log 2>&1; echo "grpo rc $?" >> $R/rc.txt
cat $R/rc.txt; tail -n 12 $R/grpo_1p7b.log | cut -c1-250
