#!/usr/bin/env bash
# 2026-11-30 session 6 (2 x H200): issue 43's must-show through run_grpo.py after the one-residual, fused-down and
# compact q/k changes: the shipped grpo_math_8B pair with lengths and prompt count changed (1 prompt x 8 generations
# of 16,384 tokens), BF16 master, activation checkpointing, side by side (BF16 GPU ${PAIR:-0 1} first), 2 steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=/tmp/s6b; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 2; tar czf $OUT/s6_call2.tgz -C /tmp s6b; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=1 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=16896 policy.generation.max_new_tokens=16384 policy.dtensor_cfg.activation_checkpointing=true grpo.mismatch_position_bin=2048"
PAIR_GPUS="${PAIR:-0 1}" SUFFIX=_16k SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=${STEPS:-2} COPY_TO=$R/r EXTRA="$X" \
  timeout 575 bash benchmarks/gpu_cli_run.sh /tmp/g8 build side_by_side > $R/run.log 2>&1
echo "rc $?"; grep -iE "preflight|expandable|error|Traceback" $R/r/*.log | head -10
python3 -m benchmarks.gpu_cli_report bf16=$R/r/bf16_16k fp8_kv=$R/r/fp8_kv_16k --skip ${SKIP:-1} --position-plot $R/mismatch_position.png > $R/report.md 2>&1; tail -n 45 $R/report.md
