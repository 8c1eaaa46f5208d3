#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): the norm's e4m3 store seen contiguous in runs of 16 bytes of its narrowest input
# (fused_ops._norm_store_run), the fused cast on at every activation dtype: the FP32 diagnostic, the GPU tests of the
# exact and matched paths, then the shipped 1.7B FP8+KV recipe fast then matched through run_grpo.py (FP32 master).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8c; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s8_call3.tgz -C /tmp s8c; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 70 python3 .gpu/fp32_norm_diag.py --squares plain > $R/diag.log 2>&1; echo "diag rc $?"
grep -E "fraction|equal|with any|fused calls" $R/diag.log | head -8
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_matched_packing_gpu.py tests/gpu/test_batch_invariant_gpu.py \
  tests/gpu/test_paged_exact_gpu.py tests/gpu/test_fused_rollout_gpu.py \
  tests/gpu/test_grpo_gpu.py::test_small_qwen3_exact_mode_fp8_kv_is_exact_at_another_micro_batch > $R/gpu_tests.log 2>&1
echo "tests rc $?"; tail -n 2 $R/gpu_tests.log; grep -hE "^FAILED|Error" $R/gpu_tests.log | head
STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 270 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv fp8_kv_matched > $R/run.log 2>&1
echo "cli rc $?"
grep -hE "matched_kernels|token_mult_prob_error|exact_token" $R/r/*.log | head -6
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
grep -E "total_step_time|decode \||timed steps|generation \|" $R/report.md
