#!/usr/bin/env bash
# call 1 (1 x H200, carry .whl .gpu): issue 44's 8B shape: random Qwen3-8B (36 layers), the shipped
# grpo_math_random_1p7B_{bf16,fp8_kv}.yaml as shipped (auto defaults) + BF16 master and 8 prompts (one GPU), 512 tokens,
# 5 steps; BF16, FP8+KV, BF16, FP8+KV alternating in one process tree; then the K/V fake-quant memory GPU test.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res1; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/res1.tgz -C /tmp res1; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt; nproc >> $R/gpu.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_precision_gpu.py -k "kv_fake_quant_memory" > $R/tests.log 2>&1; echo "tests rc=$? at $(el) s"; tail -2 $R/tests.log
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8"
SHAPE=qwen3-8b bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
for RUN in 1 2; do for V in bf16 fp8_kv; do
  [ $(el) -gt 480 ] && break 2
  SHAPE=qwen3-8b SUFFIX=_r$RUN STEPS=5 EXTRA="$X" timeout $(( 588 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}_r$RUN.log 2>&1; echo "${V}_r$RUN rc=$? at $(el) s"
  d=/tmp/g8/logs/${V}_r$RUN; mkdir -p $R/${V}_r$RUN; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/${V}_r$RUN/ 2>/dev/null
done; done
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16_r1 fp8_kv=$R/fp8_kv_r1 bf16_2=$R/bf16_r2 fp8_kv_2=$R/fp8_kv_r2 2>&1 | tail -40
