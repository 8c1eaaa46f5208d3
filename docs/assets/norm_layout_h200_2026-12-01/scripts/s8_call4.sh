#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): call 3 again, completed: the GPU tests the fused cast over FP32 activations touches
# (-v: each result as it lands), then the CLI pair after a 2-step warm-up of the fast run (call 3's fast run paid
# one-off compiles at 4 of its 5 steps).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8d; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s8_call4.tgz -C /tmp s8d; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 200 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_matched_packing_gpu.py tests/gpu/test_paged_exact_gpu.py \
  tests/gpu/test_fused_rollout_gpu.py tests/gpu/test_grpo_gpu.py::test_small_qwen3_exact_mode_fp8_kv_is_exact_at_another_micro_batch \
  > $R/gpu_tests.log 2>&1
echo "tests rc $?"; grep -cE " PASSED " $R/gpu_tests.log; grep -E " FAILED | ERROR " $R/gpu_tests.log | head; tail -n 1 $R/gpu_tests.log
STEPS=2 COPY_TO=$R/warm EXTRA="policy.generation.stop_token_ids=[]" timeout 110 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv > $R/warm.log 2>&1
echo "warm-up rc $?"
STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 220 bash benchmarks/gpu_cli_run.sh /tmp/g17 fp8_kv fp8_kv_matched > $R/run.log 2>&1
echo "cli rc $?"
grep -hE "matched_kernels: auto|token_mult_prob_error" $R/r/*.log | head -6
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
grep -E "total_step_time|decode \||prefill \||timed steps" $R/report.md
