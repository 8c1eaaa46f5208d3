#!/usr/bin/env bash
# 2026-12-01 session 7 (1 x H200; no 2-GPU machine was lent): issue 44 through run_grpo.py: the shipped
# grpo_math_random_1p7B_fp8_kv.yaml as it is, then with policy.generation.matched_kernels=auto, one after the other
# on one GPU, 5 steps each, every response to max_new_tokens (stop_token_ids=[]: equal lengths on both sides).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=/tmp/s7f; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 2; tar czf $OUT/s7_call5b.tgz -C /tmp s7f; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 560 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv fp8_kv_matched > $R/run.log 2>&1
echo "rc $?"
grep -iE "error|Traceback|matched_kernels" $R/r/*.log | head -10
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
tail -n 30 $R/report.md
