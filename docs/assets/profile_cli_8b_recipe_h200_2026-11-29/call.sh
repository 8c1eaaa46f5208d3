#!/usr/bin/env bash
# issue 44 (1 x H200, carry .whl .gpu): chrome traces (packed) of step 3's training and logprobs phases at the 8B shape,
# shipped grpo_math_8B recipes, FP8+KV then BF16, for the idle-gap analysis.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/rese4; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar cf $OUT/rese4.tar -C /tmp rese4; }
trap pack EXIT
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=512"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
export NEMO_JETRL_PROFILE="training,logprobs@3" NEMO_JETRL_PROFILE_TRACE=1
for V in fp8_kv bf16; do
  [ $(el) -gt 300 ] && break
  SHAPE=qwen3-8b RECIPE=grpo_math_8B SUFFIX=_t STEPS=3 EXTRA="$X" timeout $(( 420 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}.log 2>&1; echo "${V} rc=$? at $(el) s"
  grep -hE "^profile:|^error|Error" $R/${V}.log | cut -c1-200 | head -4
  d=/tmp/g8/logs/${V}_t; mkdir -p $R/${V}; cp $d/metrics.jsonl $d/profile/* $R/${V}/ 2>/dev/null
done
ls -la $R/*/
