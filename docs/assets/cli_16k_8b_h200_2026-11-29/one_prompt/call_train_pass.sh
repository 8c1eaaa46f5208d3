#!/usr/bin/env bash
# call 4 (1 x H200): the training pass alone at the 8B 16K shape (one packed micro-batch of 4 x 16,896 tokens, BF16
# master, activation checkpointing), BF16 / FP8+KV / FP8, with the allocator's trace: what is alive at each peak.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
for V in bf16 fp8_kv fp8; do
  [ $(el) -gt 190 ] && break
  timeout $(( 235 - $(el) )) python3 -m benchmarks.logprob_memory --pass train --shape qwen3-8b --rows 4 --seq 16896 \
    --config examples/configs/grpo_math_8B_$V.yaml policy.master_dtype=bfloat16 policy.dtensor_cfg.activation_checkpointing=true \
    policy.generation.max_new_tokens=16384 --snapshot --out $OUT/train_memory_8b_16k_$V.json 2>&1 | grep -v Warning | tail -16
  echo "$V done at $(el) s"
done
