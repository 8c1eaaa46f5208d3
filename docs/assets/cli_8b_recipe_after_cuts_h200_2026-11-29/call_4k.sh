#!/usr/bin/env bash
# 2026-11-29 s5 calls 2/3 (1 x H200, carry .whl .gpu): the shipped grpo_math_8B recipe at its own 4,096 new tokens,
# one variant per call ($V), STEPS=3 (median of steps 2-3).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/resg2_$V; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/resg2_$V.tgz -C /tmp resg2_$V; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=4096"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
SHAPE=qwen3-8b RECIPE=grpo_math_8B SUFFIX=_4k STEPS=${STEPS:-3} EXTRA="$X" timeout $(( 585 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}_4k.log 2>&1; echo "${V}_4k rc=$? at $(el) s"
grep -hE "preflight|auto ->|^error|Error" $R/${V}_4k.log | head -5
d=/tmp/g8/logs/${V}_4k; mkdir -p $R/${V}_4k; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/${V}_4k/ 2>/dev/null
python3 -m benchmarks.gpu_cli_report $V=$R/${V}_4k 2>&1 | tail -30
