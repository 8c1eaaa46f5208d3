#!/usr/bin/env bash
# 2026-11-29 s5 call 1 (1 x H200, carry .whl .gpu): GPU precision tests (division, dual-width, kv one-pass), quantizer
# bench incl. --kv and token padding, then the shipped grpo_math_8B recipes at 512 tokens x2 (profile+trace training@5 on r1).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/resg1; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/resg1.tgz -C /tmp resg1; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_precision_gpu.py > $R/qtests.log 2>&1; echo "qtests rc=$? at $(el) s"; tail -4 $R/qtests.log
timeout 100 python3 -m benchmarks.bench_quantizers --tokens 10800 --data randn,masked --rounds 5 --kv --out $R/q.json > $R/q.log 2>&1; echo "qbench rc=$? at $(el) s"; tail -30 $R/q.log
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=512"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
for RUN in 1 2; do for V in bf16 fp8_kv; do
  [ $(el) -gt 470 ] && break 2
  if [ $RUN = 1 ]; then P="training@5"; T=1; else P=""; T=0; fi
  NEMO_JETRL_PROFILE="$P" NEMO_JETRL_PROFILE_TRACE=$T SHAPE=qwen3-8b RECIPE=grpo_math_8B SUFFIX=_r$RUN STEPS=5 EXTRA="$X" timeout $(( 580 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}_r$RUN.log 2>&1; echo "${V}_r$RUN rc=$? at $(el) s"
  grep -hE "preflight|auto ->|^error|Error" $R/${V}_r$RUN.log | head -5
  d=/tmp/g8/logs/${V}_r$RUN; mkdir -p $R/${V}_r$RUN; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/${V}_r$RUN/ 2>/dev/null
  if [ -d $d/profile ]; then mkdir -p $R/${V}_r$RUN/profile; cp $d/profile/*.json $R/${V}_r$RUN/profile/ 2>/dev/null
    for tr in $d/profile/*trace*; do timeout 60 python3 -m benchmarks.trace_gaps $tr --top 30 > $R/${V}_r$RUN/trace_gaps.txt 2>&1; head -60 $R/${V}_r$RUN/trace_gaps.txt; done; fi
done; done
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16_r1 fp8_kv=$R/fp8_kv_r1 2>&1 | tail -40
[ -d $R/bf16_r2 ] && python3 -m benchmarks.gpu_cli_report bf16=$R/bf16_r2 fp8_kv=$R/fp8_kv_r2 2>&1 | tail -40
