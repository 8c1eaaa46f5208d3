#!/usr/bin/env bash
# next session, issue 44 (2 x H200, carry .whl .gpu): the shipped grpo_math_8B pair at the recipe's own 4,096 tokens,
# side by side (BF16 on GPU ${PAIR:-0 1} first), 4 steps each; call again with PAIR="1 0" on another host.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=/tmp/res8b4k; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 2; tar czf $OUT/res8b4k.tgz -C /tmp res8b4k; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
PAIR_GPUS="${PAIR:-0 1}" SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=4 COPY_TO=$R/r \
  EXTRA="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8" \
  timeout 570 bash benchmarks/gpu_cli_run.sh /tmp/g8 check build side_by_side report > $R/run.log 2>&1
echo "rc $?"; grep -E "total_step|decode|training|logprobs|timed|error" $R/run.log | head -20
