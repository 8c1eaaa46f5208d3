#!/usr/bin/env bash
# 2026-12-01 session 12 calls C/D (one H200): the shipped grpo_math_8B FP8+KV recipe at its own 4,096 tokens, one
# variant a call (V=fp8_kv: fast; V=fp8_kv_matched), 8 prompts x 8, BF16 master, 4 steps.
set -u
V=${V:?}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s12_$V; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s12_$V.tgz -C /tmp s12_$V; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
ls /tmp/g8 2>/dev/null | head -3 > $R/g8_before.txt
SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=4 COPY_TO=$R/r EXTRA="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8" \
  timeout 570 bash benchmarks/gpu_cli_run.sh /tmp/g8 build $V > $R/run.log 2>&1
echo "rc $?"
python3 -m benchmarks.gpu_cli_report $V=$R/r/$V > $R/report.md 2>&1
grep -E "total_step_time|decode \||logprobs \||training \||timed steps|token_mult|exact_token" $R/report.md
