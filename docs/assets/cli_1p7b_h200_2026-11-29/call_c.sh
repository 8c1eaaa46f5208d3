#!/usr/bin/env bash
# call C (1 x H200, chained after B on the same machine when it is still warm): 1.7B 8K FP8+KV 4 steps (Triton cache
# warm from call B where the machine is the same), then the shipped 1.7B 512-token BF16 / FP8+KV once more.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.gpu/diag:/tmp/site:$PWD TRITON_COMPILE_LOG=/tmp/resC/triton_compiles
R=/tmp/resC; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/resC.tgz -C /tmp resC; }
trap pack EXIT
ls /tmp/g8k/logs > $R/same_machine.txt 2>&1; ls ~/.triton/cache 2>/dev/null | wc -l >> $R/same_machine.txt
X="grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=8704 policy.generation.max_new_tokens=8192 grpo.mismatch_position_bin=1024"
bash benchmarks/gpu_cli_run.sh /tmp/g8k build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
STEPS=4 EXTRA="$X" timeout $(( 585 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8k fp8_kv > $R/fp8_kv.log 2>&1; echo "fp8_kv rc=$? at $(el) s"
d=/tmp/g8k/logs/fp8_kv; mkdir -p $R/fp8_kv; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/fp8_kv/ 2>/dev/null
for V in bf16 fp8_kv; do
  [ $(el) -lt 480 ] || break
  STEPS=5 SUFFIX=_512 timeout $(( 588 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8k $V > $R/${V}_512.log 2>&1; echo "${V}_512 rc=$? at $(el) s"
  d=/tmp/g8k/logs/${V}_512; mkdir -p $R/${V}_512; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/${V}_512/ 2>/dev/null
done
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/fp8_kv 2>&1 | tail -30
