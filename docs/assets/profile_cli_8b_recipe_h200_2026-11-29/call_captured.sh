#!/usr/bin/env bash
# issue 44 (1 x H200, carry .whl .gpu): why the FP8 trainer is at parity with BF16's in the CLI at the 8B shape:
# NEMO_JETRL_PROFILE="training,logprobs@3" on (a) the shipped grpo_math_8B recipes (uncaptured, 11K-token
# micro-batches) and (b) the 1.7B recipes on 8B weights (captured, 4K-token micro-batches); 3 steps each.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/rese2; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/rese2.tgz -C /tmp rese2; }
trap pack EXIT
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=512"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
export NEMO_JETRL_PROFILE="training,logprobs@3"
for RECIPE in grpo_math_8B grpo_math_random_1p7B; do for V in bf16 fp8_kv; do
  [ $(el) -gt 500 ] && break 2
  S=_${RECIPE: -3}
  SHAPE=qwen3-8b RECIPE=$RECIPE SUFFIX=$S STEPS=3 EXTRA="$X" timeout $(( 580 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}$S.log 2>&1; echo "${V}$S rc=$? at $(el) s"
  grep -hE "^profile:|auto ->|^error|Error" $R/${V}$S.log | cut -c1-400 | head -6
  d=/tmp/g8/logs/${V}$S; mkdir -p $R/${V}$S; cp -r $d/{metrics.jsonl,config.yaml,profile} $R/${V}$S/ 2>/dev/null
done; done
