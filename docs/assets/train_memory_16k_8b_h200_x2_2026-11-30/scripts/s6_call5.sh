#!/usr/bin/env bash
# 2026-11-30 session 6 (2 x H200): GPU tests not run since last stop's trainer changes (compact q/k, fused down input,
# one residual): the exact / matched paths on GPU 0, the FP8 step, GRPO and recipes on GPU 1.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s6e; mkdir -p $R
pack() { tar czf $OUT/s6_call5.tgz -C /tmp s6e; }
trap pack EXIT
nvidia-smi --query-gpu=index,name --format=csv > $R/gpu.txt
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matched_packing_gpu.py tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_paged_exact_gpu.py > $R/gpu_tests_0.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 400 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_train_step_gpu.py tests/gpu/test_grpo_gpu.py tests/gpu/test_recipes_gpu.py tests/gpu/test_precision_gpu.py tests/gpu/test_packing_gpu.py > $R/gpu_tests_1.log 2>&1 &
wait
tail -n 3 $R/gpu_tests_0.log; tail -n 3 $R/gpu_tests_1.log; grep -E "FAILED|Error" $R/gpu_tests_*.log | head -20
