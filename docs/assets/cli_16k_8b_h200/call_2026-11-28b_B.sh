#!/usr/bin/env bash
# session 2026-11-28b call B (4 x H200): GPUs 0,1 8B @ 16K with activation checkpointing (FP8+KV beside BF16, 1 step);
# GPU2 bench_rollout 8B 512 -> 2,048 (issue 42's ratio); GPU3 the MoE exact-mode diagnosis, then test_moe_gpu again.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=$OUT/r; mkdir -p $R /tmp/b
finish() { cp /tmp/b/*.json $R/ 2>/dev/null; cp /tmp/g8/*_16k.log $R/ 2>/dev/null; for d in /tmp/g8/logs/*_16k; do v=$(basename $d); mkdir -p $R/$v; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/$v/ 2>/dev/null; done; tar czf $OUT/callB.tgz -C $R . ; rm -rf $R; }
trap finish EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
( CUDA_VISIBLE_DEVICES=2 timeout 580 python3 -m benchmarks.bench_rollout --layers 36 --batch 128 --gen-len 2048 --repeats 5 --eager-steps 0 --variants bf16,fp8+kv --out /tmp/b/rollout_8b.json > $R/bench_rollout.log 2>&1; echo "bench_rollout rc=$? at $(el) s"; tail -6 $R/bench_rollout.log ) &
( export CUDA_VISIBLE_DEVICES=3
  timeout 200 python3 .gpu/moe_exact_diag.py > $R/moe_diag.log 2>&1; echo "diag rc=$? at $(el) s"; cat $R/moe_diag.log | grep -v Warning | tail -20
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_moe_gpu.py > $R/moe_gpu.log 2>&1; echo "moe gpu rc=$? at $(el) s"; grep -E "^FAILED|passed|failed" $R/moe_gpu.log | tail -6 ) &
( CUDA_VISIBLE_DEVICES=0 SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"; tail -3 $R/build.log
  X="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=2 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=16896 policy.generation.max_new_tokens=16384 policy.dtensor_cfg.activation_checkpointing=true grpo.mismatch_position_bin=2048"
  run() { CUDA_VISIBLE_DEVICES=$1 GPU=$1 NPROC=1 SUFFIX=_16k SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=1 EXTRA="$X" timeout $(( 588 - $(el) )) \
      bash benchmarks/gpu_cli_run.sh /tmp/g8 $2 > $R/stage_$2_16k.log 2>&1; echo "$2_16k rc=$? at $(el) s"; grep -E "^error|preflight" $R/stage_$2_16k.log | head -3; }
  run 0 fp8_kv & run 1 bf16 & wait
  python3 -m benchmarks.gpu_cli_report bf16_16k=/tmp/g8/logs/bf16_16k fp8_kv_16k=/tmp/g8/logs/fp8_kv_16k 2>&1 | tail -25 ) &
wait
