#!/usr/bin/env bash
# 2026-12-01 session 10 call 5: the decode within 128 registers at 3 stages (working tree): the paged / continuous
# batching GPU tests, then the CLI pair (the shipped 1.7B FP8+KV recipe, then with matched_kernels=auto; equal lengths)
# after a 2-step warm-up of the fast run, every Triton compile logged with its time.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c5; mkdir -p $R/compiles
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s10_call5.tgz -C /tmp s10c5; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_continuous_batching_gpu.py tests/gpu/test_grpo_gpu.py -k "captured or bucket or exact" \
  > $R/gpu_tests.log 2>&1; echo "tests rc $?"
grep -E "FAILED|ERROR" $R/gpu_tests.log | head; tail -n 1 $R/gpu_tests.log
STEPS=2 COPY_TO=$R/warm EXTRA="policy.generation.stop_token_ids=[]" timeout 110 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv > $R/warm.log 2>&1
echo "warm-up rc $?"
TRITON_COMPILE_LOG=$R/compiles/log STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 230 bash benchmarks/gpu_cli_run.sh /tmp/g17 fp8_kv fp8_kv_matched > $R/run.log 2>&1
echo "cli rc $?"
grep -hE "matched_kernels: auto|token_mult_prob_error" $R/r/*.log | head -6
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
grep -E "total_step_time|decode \||prefill \||timed steps|generation|train " $R/report.md | head -20
wc -l $R/compiles/* | tail -n 3
