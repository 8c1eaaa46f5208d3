#!/usr/bin/env bash
# call B (1 x H200): 1.7B 8K, BF16 4 steps (captured trainer by default), then FP8+KV 1 step (cold Triton cache).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.gpu/diag:/tmp/site:$PWD TRITON_COMPILE_LOG=/tmp/resB/triton_compiles
R=/tmp/resB; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/resB.tgz -C /tmp resB; }
trap pack EXIT
X="grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=8704 policy.generation.max_new_tokens=8192 grpo.mismatch_position_bin=1024"
bash benchmarks/gpu_cli_run.sh /tmp/g8k build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
STEPS=4 EXTRA="$X" timeout $(( 585 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8k bf16 > $R/bf16.log 2>&1; echo "bf16 rc=$? at $(el) s"
d=/tmp/g8k/logs/bf16; mkdir -p $R/bf16; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/bf16/ 2>/dev/null
STEPS=1 SUFFIX=_cold EXTRA="$X" timeout $(( 588 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8k fp8_kv > $R/fp8_kv_cold.log 2>&1; echo "fp8_kv_cold rc=$? at $(el) s"
d=/tmp/g8k/logs/fp8_kv_cold; mkdir -p $R/fp8_kv_cold; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/fp8_kv_cold/ 2>/dev/null
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16 2>&1 | tail -30
