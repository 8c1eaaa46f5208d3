#!/usr/bin/env bash
# 2026-11-30 session 5 (2 x H200): the 16K training pass at steps 1 and 2 after the checkpoint-aware release in op_input_linear, BF16 GPU 0, FP8+KV GPU 1.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s5c; mkdir -p $R
pack() { tar czf $OUT/s5_43c.tgz -C /tmp s5c; }
trap pack EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
mem() {  # $1 variant, $2 gpu, $3 tag, $4 extra flag, $5 steps
  CUDA_VISIBLE_DEVICES=$2 timeout 200 python3 -m benchmarks.logprob_memory --pass train --shape qwen3-8b --rows 4 --seq 16896 --steps $5 \
    --config examples/configs/grpo_math_8B_$1.yaml policy.master_dtype=bfloat16 policy.dtensor_cfg.activation_checkpointing=true \
    policy.generation.max_new_tokens=16384 $4 --out $R/train_memory_8b_16k_step$5_$1_$3.json > $R/train_memory_step$5_$1_$3.log 2>&1
  echo "$1 $3 rc $? at $(el) s"
}
both() { mem bf16 0 $1 "$2" $3 & mem fp8_kv 1 $1 "$2" $3; wait; }
both traced --snapshot 2
both untraced "" 2
both untraced "" 1
for f in $R/train_memory_*.log; do echo "== $f"; grep -v Warning $f | grep -E "measured|estimate|held from|reached by|GiB  " | head -40; done
wait
