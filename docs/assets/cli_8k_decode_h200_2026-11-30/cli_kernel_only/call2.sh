#!/usr/bin/env bash
# issue 43 (1 x H200): the FP8 decode kernel at 3 CTAs/SM over long caches; its GPU tests, then the 1.7B shape's
# 8K-token CLI run of the shipped FP8+KV recipe (4 steps)
set -u
export PYTHONUNBUFFERED=1
[ -d /tmp/site/omegaconf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
D=/tmp/l8; X="grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=8704 policy.generation.max_new_tokens=8192 grpo.mismatch_position_bin=1024"
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
timeout 120 python3 -m pytest -q -n 0 -x tests/gpu/test_continuous_batching_gpu.py -k "cuda or paged" > $OUT/tests.log 2>&1; echo "tests rc $? at $(el) s"; tail -3 $OUT/tests.log
[ -f $D/ckpt/build_info.json ] || bash benchmarks/gpu_cli_run.sh $D check build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "build ready at $(el) s"
L=$(( 560 - $(el) ))
STEPS=4 EXTRA="$X" COPY_TO=$OUT/r timeout $L bash benchmarks/gpu_cli_run.sh $D fp8_kv > $OUT/stage_fp8.log 2>&1
echo "run rc $? at $(el) s"
grep -hE "preflight|auto ->|^error|Traceback" $OUT/stage_fp8.log | head -8
python3 -m benchmarks.gpu_cli_report fp8_kv=$OUT/r/fp8_kv 2>&1 | tail -30
timeout $(( 595 - $(el) )) python3 -m pytest -q -n 0 -s tests/gpu/test_tune_cache_gpu.py 2>&1 | grep -v "^$" | tail -12
