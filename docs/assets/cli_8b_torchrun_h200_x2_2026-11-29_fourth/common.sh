# sourced by each call: carried wheels, NCCL settings, result packing (issue 45 / 44 runs on 2 x H200)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
[ -d /tmp/site/omegaconf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=$OUT/r; mkdir -p $R
finish() { cp /tmp/g8/*.log $R/ 2>/dev/null; for d in /tmp/g8/logs/*; do v=$(basename $d); mkdir -p $R/$v; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/$v/ 2>/dev/null; done; tar czf $OUT/$CALL.tgz -C $R . ; rm -rf $R; }
trap finish EXIT
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
X="policy.master_dtype=bfloat16 policy.train_micro_batch_size=4 policy.logprob_batch_size=8"
run() {  # $1 gpus, $2 nproc, $3 suffix, $4 variant, $5 extra, $6 timeout
  CUDA_VISIBLE_DEVICES=$1 GPU=$1 NPROC=$2 SUFFIX=$3 SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=4 EXTRA="$X $5" timeout $6 \
    bash benchmarks/gpu_cli_run.sh /tmp/g8 $4 > $R/stage_$4$3.log 2>&1; echo "$4$3 rc=$? at $(el) s"; }
build() { if [ ! -f /tmp/g8/ckpt/build_info.json ]; then CUDA_VISIBLE_DEVICES=0 SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 check build > $R/build_stage_$CALL.log 2>&1 || { tail -20 $R/build_stage_$CALL.log; exit 1; }; fi; echo "build ready at $(el) s"; }
report() { for f in $R/stage_*.log; do echo "== $f"; grep -hE "preflight|auto ->|^error|Error|Traceback" $f | head -5; done
  runs=""; for d in /tmp/g8/logs/*; do [ -f $d/metrics.jsonl ] && runs="$runs $(basename $d)=$d"; done
  python3 -m benchmarks.gpu_cli_report $runs 2>&1 | tail -45; }
