#!/usr/bin/env bash
# call 4c (same 4 x H200, right after 4b): issue 47 MoE (Qwen3-30B-A3B shape) rollout on GPU 0, train step then mismatch
# on GPU 1; issue 43: random Qwen3-8B at 16K-token responses, FP8+KV on GPU 2 beside BF16 on GPU 3 (2 steps).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
[ -d /tmp/g8/ckpt ] || { echo "no /tmp/g8/ckpt: fresh machine"; exit 3; }
R=$OUT/r; mkdir -p $R /tmp/b
finish() { cp /tmp/g8/*_16k.log $R/ 2>/dev/null; for d in /tmp/g8/logs/*_16k; do v=$(basename $d); mkdir -p $R/$v; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/$v/ 2>/dev/null; done; cp /tmp/b/moe_*.json /tmp/b/*.png $R/ 2>/dev/null; tar czf $OUT/call4c.tgz -C $R . ; rm -rf $R; }
trap finish EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=2 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=16896 policy.generation.max_new_tokens=16384 grpo.mismatch_position_bin=2048"
run() { CUDA_VISIBLE_DEVICES=$1 GPU=$1 NPROC=1 SUFFIX=_16k SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=2 EXTRA="$X" timeout 565 \
    bash benchmarks/gpu_cli_run.sh /tmp/g8 $2 > $R/stage_$2_16k.log 2>&1; echo "$2_16k rc=$? at $(el) s"; }
run 2 fp8_kv & run 3 bf16 &
( CUDA_VISIBLE_DEVICES=0 timeout 565 python3 -m benchmarks.bench_rollout --shape qwen3-30b-a3b --batch 128 --prompt-len 512 --gen-len 1024 --repeats 5 --eager-steps 0 --variants bf16,fp8+kv --out /tmp/b/moe_rollout.json > $R/moe_rollout.log 2>&1; echo "moe rollout rc=$? at $(el) s"; tail -12 $R/moe_rollout.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m benchmarks.bench_train_step --shape qwen3-30b-a3b --layers 4 --warmup 2 --steps 5 --fp8-recipe blockwise --out /tmp/b/moe_train.json > $R/moe_train.log 2>&1; echo "moe train rc=$? at $(el) s"; tail -10 $R/moe_train.log
  timeout $(( 565 - $(el) )) python3 -m benchmarks.bench_mismatch --shape qwen3-30b-a3b --layers 8 --steps 1 --out /tmp/b/moe_mismatch.json --plot /tmp/b/moe_mismatch.png > $R/moe_mismatch.log 2>&1; echo "moe mismatch rc=$? at $(el) s"; tail -16 $R/moe_mismatch.log ) &
wait
runs=""; for d in /tmp/g8/logs/*_16k; do [ -f $d/metrics.jsonl ] && runs="$runs $(basename $d)=$d"; done
python3 -m benchmarks.gpu_cli_report $runs 2>&1 | tail -30
