#!/usr/bin/env bash
# call 4a (4 x H200): issue 45. Build random Qwen3-8B; torchrun GPU test; then FP8+KV DP=2 (GPUs 0,1) beside
# BF16 DP=2 (GPUs 2,3), both 16 prompts x 8 (the shipped recipe's 64 responses a GPU), 4 steps. /tmp/g8 kept for 4b.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=$OUT/r; mkdir -p $R
finish() { cp /tmp/g8/*.log $R/ 2>/dev/null; for d in /tmp/g8/logs/*; do v=$(basename $d); mkdir -p $R/$v; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/$v/ 2>/dev/null; done; tar czf $OUT/call4a.tgz -C $R . ; rm -rf $R; }
trap finish EXIT
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=16 policy.train_micro_batch_size=4 policy.logprob_batch_size=8"
run() {  # $1 gpus, $2 nproc, $3 suffix, $4 variant, $5 extra, $6 timeout
  CUDA_VISIBLE_DEVICES=$1 GPU=$1 NPROC=$2 SUFFIX=$3 SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=4 EXTRA="$X $5" timeout $6 \
    bash benchmarks/gpu_cli_run.sh /tmp/g8 $4 > $R/stage_$4$3.log 2>&1; echo "$4$3 rc=$? at $(el) s"; }
CUDA_VISIBLE_DEVICES=0 SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 check build > $R/build_stage.log 2>&1 || { tail -20 $R/build_stage.log; exit 1; }
echo "build done at $(el) s"
L=$(( 585 - $(el) ))
run 0,1 2 _dp2 fp8_kv "" $L & run 2,3 2 _dp2 bf16 "" $L & wait
[ $(el) -lt 470 ] && { CUDA_VISIBLE_DEVICES=0,1 timeout $(( 585 - $(el) )) python3 -m pytest -q -p no:cacheprovider -n 0 tests/gpu/test_torchrun_gpu.py > $R/torchrun_gpu_test.log 2>&1; echo "torchrun gpu test rc=$? at $(el) s"; tail -3 $R/torchrun_gpu_test.log; }
for f in $R/stage_*.log; do echo "== $f"; grep -hE "preflight|^error|Error|Traceback" $f | head -4; done
runs=""; for d in /tmp/g8/logs/*; do [ -f $d/metrics.jsonl ] && runs="$runs $(basename $d)=$d"; done
python3 -m benchmarks.gpu_cli_report $runs 2>&1 | tail -40
