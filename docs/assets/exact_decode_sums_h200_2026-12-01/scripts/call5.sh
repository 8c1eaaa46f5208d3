#!/usr/bin/env bash
# 2026-12-01 session 9 (1 x H200): probe 5 (the paged regression's shape), the GPU tests of the exact / matched paths
# with the per-slot sums, then the 1.7B GRPO step fast vs matched (performance.md's command).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s9; mkdir -p $R
pack() { cp $0 $R/; tar czf $OUT/s9_call5.tgz -C /tmp s9; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 120 python3 .gpu/probe5.py > $R/probe5.log 2>&1; echo "probe5 rc $?" >> $R/rc.txt
grep shape $R/probe5.log
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_paged_exact_gpu.py \
  tests/gpu/test_matched_packing_gpu.py tests/gpu/test_grpo_gpu.py::test_small_qwen3_exact_mode_fp8_kv_is_exact_at_another_micro_batch \
  > $R/gpu_tests.log 2>&1; echo "tests rc $?" >> $R/rc.txt
grep -E "FAILED|ERROR" $R/gpu_tests.log | head; tail -n 1 $R/gpu_tests.log
timeout 270 python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --prompts 128 --prompt-len 180 \
  --gen-len 512 --micro-batch 4 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
  --out $R/grpo_1p7b.json > $R/grpo_1p7b.log 2>&1; echo "grpo rc $?" >> $R/rc.txt
cat $R/rc.txt; tail -n 8 $R/grpo_1p7b.log
