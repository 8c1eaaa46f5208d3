#!/usr/bin/env bash
# call 2 (1 x H200): issue 43's 16K memory: random Qwen3-8B, shipped grpo_math_8B recipes with lengths and prompt
# count changed (1 prompt x 8 generations of 16,384 tokens), BF16 master, activation checkpointing (expandable segments
# now derived for both), one step each: BF16 then FP8+KV (K/V fake-quant by slices).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res2; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/res2.tgz -C /tmp res2; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=1 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=16896 policy.generation.max_new_tokens=16384 policy.dtensor_cfg.activation_checkpointing=true grpo.mismatch_position_bin=2048"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
for V in ${VARIANTS:-fp8_kv bf16}; do
  SUFFIX=_16k SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=1 EXTRA="$X" timeout $(( 590 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}_16k.log 2>&1; echo "${V}_16k rc=$? at $(el) s"
  d=/tmp/g8/logs/${V}_16k; mkdir -p $R/${V}_16k; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/${V}_16k/ 2>/dev/null
  grep -i "expandable\|preflight\|error" $R/${V}_16k.log | head -5
done
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16_16k fp8_kv=$R/fp8_kv_16k --skip 0 2>&1 | tail -40
