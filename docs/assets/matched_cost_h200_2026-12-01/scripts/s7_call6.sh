#!/usr/bin/env bash
# 2026-12-01 session 7 (1 x H200): the glue norm's squares rounded on their own (mul.rn), so the fused norm + FP8 cast
# stays on under the exact mode and matched kernels with FP32 activations too (the shipped recipes' FP32 master
# weights). The GPU tests of the exact / matched paths and the fused kernels, then the shipped 1.7B FP8+KV recipe
# fast and matched through run_grpo.py, one after the other, equal lengths (stop_token_ids=[]), 5 steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s7g; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 2; tar czf $OUT/s7_call6.tgz -C /tmp s7g; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 290 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grpo_gpu.py tests/gpu/test_matched_packing_gpu.py \
  tests/gpu/test_paged_exact_gpu.py tests/gpu/test_fused_rollout_gpu.py tests/gpu/test_fused_train_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $?"
tail -n 3 $R/gpu_tests.log; grep -hE "FAILED|Error" $R/gpu_tests.log | head -20
STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 170 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv fp8_kv_matched > $R/run.log 2>&1
echo "cli rc $?"
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
grep -E "total_step_time|decode:|timed steps|token_mult_prob_error by|exact_token_fraction by" $R/report.md
