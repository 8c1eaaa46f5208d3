#!/usr/bin/env bash
# 2026-11-30 session 3, next session (2 x H200; the early stop now off while tracing): issue 43's last item, where the 8B 16K training pass's peak is: the pass
# alone (4 x 16,896 tokens, BF16 master, activation checkpointing) with the allocator's trace (Python frames),
# BF16 on GPU 0 and FP8+KV on GPU 1 at once.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
mem() {  # $1 variant, $2 gpu
  CUDA_VISIBLE_DEVICES=$2 timeout 230 python3 -m benchmarks.logprob_memory --pass train --shape qwen3-8b --rows 4 --seq 16896 \
    --config examples/configs/grpo_math_8B_$1.yaml policy.master_dtype=bfloat16 policy.dtensor_cfg.activation_checkpointing=true \
    policy.generation.max_new_tokens=16384 --snapshot --out $OUT/train_memory_8b_16k_$1.json > $OUT/train_memory_$1.log 2>&1
  echo "$1 rc $? at $(el) s"
}
mem bf16 0 &
mem fp8_kv 1
wait
for v in bf16 fp8_kv; do grep -v Warning $OUT/train_memory_$v.log | tail -16; done
