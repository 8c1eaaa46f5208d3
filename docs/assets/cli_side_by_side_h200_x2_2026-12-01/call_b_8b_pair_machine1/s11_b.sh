#!/usr/bin/env bash
# 2026-12-01 session 11 call B (2 x H200): the shipped grpo_math_8B FP8+KV recipe at its own 4,096 tokens, fast vs
# matched_kernels=auto side by side (fast on GPU ${PAIR:-0 1} first), 8 prompts x 8, BF16 master, 4 steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s11b; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 2; cp $0 $R/ 2>/dev/null; tar czf $OUT/s11_b.tgz -C /tmp s11b; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
TRITON_COMPILE_LOG=$R/compile.log PAIR_GPUS="${PAIR:-0 1}" PAIR_VARIANTS="fp8_kv fp8_kv_matched" SHAPE=qwen3-8b \
  RECIPE=grpo_math_8B STEPS=4 COPY_TO=$R/r EXTRA="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8" \
  timeout 575 bash benchmarks/gpu_cli_run.sh /tmp/g8 check build side_by_side > $R/run.log 2>&1
echo "rc $?"
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
grep -E "total_step_time|decode \||logprobs \||training \||timed steps|token_mult" $R/report.md
