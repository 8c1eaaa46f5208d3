#!/usr/bin/env bash
# 2026-11-30 session 5 (2 x H200): issue 43's 16K training pass after the one-residual checkpoints and the fused
# SiLU*up FP8 input, BF16 on GPU 0 and FP8+KV on GPU 1 at once: traced (--snapshot) then untraced; then the GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s5; mkdir -p $R
pack() { tar czf $OUT/s5_43.tgz -C /tmp s5; }
trap pack EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
mem() {  # $1 variant, $2 gpu, $3 tag, $4 extra flag
  CUDA_VISIBLE_DEVICES=$2 timeout 200 python3 -m benchmarks.logprob_memory --pass train --shape qwen3-8b --rows 4 --seq 16896 \
    --config examples/configs/grpo_math_8B_$1.yaml policy.master_dtype=bfloat16 policy.dtensor_cfg.activation_checkpointing=true \
    policy.generation.max_new_tokens=16384 $4 --out $R/train_memory_8b_16k_$1_$3.json > $R/train_memory_$1_$3.log 2>&1
  echo "$1 $3 rc $? at $(el) s"
}
both() { mem bf16 0 $1 "$2" & mem fp8_kv 1 $1 "$2"; wait; }
both traced --snapshot
both untraced ""
for f in $R/train_memory_*.log; do echo "== $f"; grep -v Warning $f | grep -E "measured|estimate|held from|GiB  " | head -60; done
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_fused_train_gpu.py tests/gpu/test_activation_checkpointing_gpu.py > $R/gpu_tests_0.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_matched_packing_gpu.py tests/gpu/test_train_graphs_gpu.py tests/gpu/test_fp8_train_step_gpu.py > $R/gpu_tests_1.log 2>&1 &
wait
tail -5 $R/gpu_tests_0.log $R/gpu_tests_1.log; echo "done at $(el) s"
