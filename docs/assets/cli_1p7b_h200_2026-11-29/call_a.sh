#!/usr/bin/env bash
# call A (1 x H200, carry .whl .gpu): GPU tests of the rollout's timing parts and the allocator release; the shipped
# 1.7B recipes at 512 tokens (BF16, FP8+KV, FP8+KV matched=auto), 5 steps each, one after the other, with the new
# generation/{prefill,cuda_graph_capture,decode} timings; then FP8+KV again on a warm Triton cache.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/resA; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/resA.tgz -C /tmp resA; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt; nproc >> $R/gpu.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_graph_decode.py tests/gpu/test_activation_checkpointing_gpu.py -k "graph_greedy or released or timer" > $R/tests.log 2>&1; echo "tests rc=$? at $(el) s"; tail -3 $R/tests.log
bash benchmarks/gpu_cli_run.sh /tmp/g build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
for V in bf16 fp8_kv fp8_kv_matched; do
  STEPS=5 timeout $(( 585 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g $V > $R/$V.log 2>&1; echo "$V rc=$? at $(el) s"
  d=/tmp/g/logs/$V; mkdir -p $R/$V; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/$V/ 2>/dev/null
done
if [ $(el) -lt 470 ]; then
  STEPS=3 SUFFIX=_warm timeout $(( 585 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g fp8_kv > $R/fp8_kv_warm.log 2>&1; echo "fp8_kv_warm rc=$? at $(el) s"
  d=/tmp/g/logs/fp8_kv_warm; mkdir -p $R/fp8_kv_warm; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/fp8_kv_warm/ 2>/dev/null
fi
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16 fp8_kv=$R/fp8_kv matched=$R/fp8_kv_matched 2>&1 | tail -45
