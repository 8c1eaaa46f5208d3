#!/usr/bin/env bash
# 2026-11-29 s4 call 1 (1 x H200, carry .whl .gpu): quantizer reciprocal form (GPU tests + bench), then the shipped
# grpo_math_8B recipes at the 8B shape on real (coin-flip) gradients: BF16, FP8+KV (+ second pair if time), profile training@5.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/resf1; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/resf1.tgz -C /tmp resf1; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_precision_gpu.py -k "reciprocal or act_quant or boundaries" > $R/qtests.log 2>&1; echo "qtests rc=$? at $(el) s"; tail -3 $R/qtests.log
timeout 150 python3 -m benchmarks.bench_quantizers --tokens 10752 --data randn,zeros,masked --rounds 5 --out $R/q.json > $R/q.log 2>&1; echo "qbench rc=$? at $(el) s"; grep -E "quant_groups|cast" $R/q.log | head -40
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=512"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
for RUN in 1 2; do for V in bf16 fp8_kv; do
  [ $(el) -gt 480 ] && break 2
  NEMO_JETRL_PROFILE="training@5" SHAPE=qwen3-8b RECIPE=grpo_math_8B SUFFIX=_r$RUN STEPS=5 EXTRA="$X" timeout $(( 585 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}_r$RUN.log 2>&1; echo "${V}_r$RUN rc=$? at $(el) s"
  grep -hE "preflight|auto ->|^error|Error" $R/${V}_r$RUN.log | head -5
  d=/tmp/g8/logs/${V}_r$RUN; mkdir -p $R/${V}_r$RUN; cp -r $d/{metrics.jsonl,config.yaml,gpu_memory.csv,profile} $R/${V}_r$RUN/ 2>/dev/null
done; done
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16_r1 fp8_kv=$R/fp8_kv_r1 2>&1 | tail -45
