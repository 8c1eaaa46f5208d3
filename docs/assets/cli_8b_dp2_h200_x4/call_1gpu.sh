#!/usr/bin/env bash
# call 4b (same 4 x H200, right after 4a): FP8+KV (GPU 0) beside BF16 (GPU 1) on one GPU, 8 prompts x 8, 4 steps;
# the GPU suite on GPU 2; bench_rollout then bench_train_step on GPU 3 (issue 42: ratios unchanged).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
[ -d /tmp/g8/ckpt ] || { echo "no /tmp/g8/ckpt: fresh machine"; exit 3; }
R=$OUT/r; mkdir -p $R
finish() { cp /tmp/g8/*_1gpu.log $R/ 2>/dev/null; for d in /tmp/g8/logs/*_1gpu; do v=$(basename $d); mkdir -p $R/$v; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/$v/ 2>/dev/null; done; cp /tmp/b/*.json $R/ 2>/dev/null; tar czf $OUT/call4b.tgz -C $R . ; rm -rf $R; }
trap finish EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.train_micro_batch_size=4 policy.logprob_batch_size=8"
run() { CUDA_VISIBLE_DEVICES=$1 GPU=$1 NPROC=1 SUFFIX=_1gpu SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=4 EXTRA="$X" timeout 560 \
    bash benchmarks/gpu_cli_run.sh /tmp/g8 $2 > $R/stage_$2_1gpu.log 2>&1; echo "$2_1gpu rc=$? at $(el) s"; }
mkdir -p /tmp/b
run 0 fp8_kv & run 1 bf16 &
( CUDA_VISIBLE_DEVICES=2 timeout 560 python3 -m pytest -q -p no:cacheprovider -n 0 --durations=6 tests/gpu --ignore=tests/gpu/test_torchrun_gpu.py > $R/gpu_suite.log 2>&1; echo "gpu suite rc=$? at $(el) s"; tail -12 $R/gpu_suite.log ) &
( export CUDA_VISIBLE_DEVICES=3
  timeout 280 python3 -m benchmarks.bench_rollout --layers 36 --batch 128 --gen-len 2048 --repeats 5 --eager-steps 0 --variants bf16,fp8+kv --out /tmp/b/rollout.json > $R/bench_rollout.log 2>&1; echo "bench_rollout rc=$? at $(el) s"; tail -8 $R/bench_rollout.log
  timeout $(( 560 - $(el) )) python3 -m benchmarks.bench_train_step --layers 36 --rounds 3 --warmup 2 --steps 2 --cuda-graphs on --fp8-recipe blockwise --cached-dgrad-weight --causal-attention --out /tmp/b/train_step.json > $R/bench_train.log 2>&1; echo "bench_train rc=$? at $(el) s"; tail -8 $R/bench_train.log ) &
wait
runs=""; for d in /tmp/g8/logs/*; do [ -f $d/metrics.jsonl ] && runs="$runs $(basename $d)=$d"; done
python3 -m benchmarks.gpu_cli_report $runs 2>&1 | tail -40
