#!/usr/bin/env bash
# 2026-11-29 s4 call 2 (1 x H200, carry .whl .gpu): zero-safe division in the quantizer (GPU tests + bench), then the
# shipped grpo_math_8B recipes at the 8B shape with 2,048-token responses: BF16, FP8+KV, 4 steps each.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/resf2; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/resf2.tgz -C /tmp resf2; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_precision_gpu.py > $R/qtests.log 2>&1; echo "qtests rc=$? at $(el) s"; tail -3 $R/qtests.log
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_graph_decode.py -k "write" > $R/kvtests.log 2>&1; echo "kvtests rc=$? at $(el) s"; tail -2 $R/kvtests.log
timeout 100 python3 -m benchmarks.bench_quantizers --tokens 10752 --data randn,zeros,masked --rounds 5 --out $R/q.json > $R/q.log 2>&1; echo "qbench rc=$? at $(el) s"; grep -E "quant_groups" $R/q.log
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=2048"
SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
for V in bf16 fp8_kv; do
  SHAPE=qwen3-8b RECIPE=grpo_math_8B SUFFIX=_2k STEPS=4 EXTRA="$X" timeout $(( 505 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/${V}_2k.log 2>&1; echo "${V}_2k rc=$? at $(el) s"
  grep -hE "preflight|auto ->|^error|Error" $R/${V}_2k.log | head -5
  d=/tmp/g8/logs/${V}_2k; mkdir -p $R/${V}_2k; cp -r $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/${V}_2k/ 2>/dev/null
done
python3 -m benchmarks.gpu_cli_report bf16=$R/bf16_2k fp8_kv=$R/fp8_kv_2k 2>&1 | tail -40
