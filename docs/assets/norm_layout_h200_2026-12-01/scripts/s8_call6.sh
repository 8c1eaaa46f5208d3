#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): the CLI pair of call 4 again, in the other order (matched, then fast), after the
# same 2-step warm-up of the fast recipe: does 1.07x hold?
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8f; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s8_call6.tgz -C /tmp s8f; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
STEPS=2 COPY_TO=$R/warm EXTRA="policy.generation.stop_token_ids=[]" timeout 100 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv > $R/warm.log 2>&1
echo "warm-up rc $?"
STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 200 bash benchmarks/gpu_cli_run.sh /tmp/g17 fp8_kv_matched fp8_kv > $R/run.log 2>&1
echo "cli rc $?"
grep -hE "matched_kernels: auto|token_mult_prob_error" $R/r/*.log | head -6
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
grep -E "total_step_time|decode \||prefill \||training \||timed steps" $R/report.md
