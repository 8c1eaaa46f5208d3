#!/usr/bin/env bash
# issue 44/43 (1 x H200, carry .whl .gpu): the shipped grpo_math_8B_{bf16,fp8_kv}.yaml at the 8B shape (random Qwen3-8B,
# 36 layers) with only lengths and prompt counts changed (+ BF16 master for one GPU and what gpu_cli_run's RECIPE
# adds for random weights): 8 prompts x 8, 512 tokens, 5 steps; BF16, FP8+KV, BF16, FP8+KV alternating; then the
# graph-pool GPU tests. The report prints the estimate against allocated + graph pools.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/rese1; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/rese1.tgz -C /tmp rese1; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=512"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
for RUN in 1 2; do for V in bf16 fp8_kv; do
  [ $(el) -gt 470 ] && break 2
  SHAPE=qwen3-8b RECIPE=grpo_math_8B SUFFIX=_r$RUN STEPS=5 EXTRA="$X" timeout $(( 575 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}_r$RUN.log 2>&1; echo "${V}_r$RUN rc=$? at $(el) s"
  grep -hE "preflight|auto ->|^error|Error" $R/${V}_r$RUN.log | head -5
  d=/tmp/g8/logs/${V}_r$RUN; mkdir -p $R/${V}_r$RUN; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/${V}_r$RUN/ 2>/dev/null
done; done
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16_r1 fp8_kv=$R/fp8_kv_r1 bf16_2=$R/bf16_r2 fp8_kv_2=$R/fp8_kv_r2 2>&1 | tail -45
[ $(el) -lt 540 ] && timeout $(( 590 - $(el) )) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_activation_checkpointing_gpu.py -k "graph_pool or timer or released" > $R/tests.log 2>&1; echo "tests rc=$? at $(el) s"; tail -2 $R/tests.log
