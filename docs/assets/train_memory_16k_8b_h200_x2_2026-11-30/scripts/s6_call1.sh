#!/usr/bin/env bash
# 2026-11-30 session 6 (2 x H200, fresh machine): the 16K training pass at step 2 in the machine's first FP8 process
# (the side-stream fix for the 165 MiB cuBLAS workspace), BF16 GPU 0, FP8+KV GPU 1 at once; then the GPU tests of
# the tuner's timing, the fused trainer, checkpointing, the captured decode and the captured trainer.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s6a; mkdir -p $R
pack() { tar czf $OUT/s6_call1.tgz -C /tmp s6a; }
trap pack EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
ls ~/.cache/nemo_jetrl 2>/dev/null > $R/cache_before.txt
mem() {  # $1 variant, $2 gpu
  CUDA_VISIBLE_DEVICES=$2 timeout 150 python3 -m benchmarks.logprob_memory --pass train --shape qwen3-8b --rows 4 --seq 16896 --steps 2 \
    --config examples/configs/grpo_math_8B_$1.yaml policy.master_dtype=bfloat16 policy.dtensor_cfg.activation_checkpointing=true \
    policy.generation.max_new_tokens=16384 --out $R/train_memory_8b_16k_step2_$1.json > $R/train_memory_step2_$1.log 2>&1
  echo "$1 rc $? at $(el) s"
}
mem bf16 0 & mem fp8_kv 1; wait
for v in bf16 fp8_kv; do echo "== $v"; grep -E "measured|estimate|held|before|peak" $R/train_memory_step2_$v.log | head -12; done
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tune_cache_gpu.py tests/gpu/test_fused_train_gpu.py tests/gpu/test_cuda_graph_decode.py > $R/gpu_tests_0.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_activation_checkpointing_gpu.py tests/gpu/test_train_graphs_gpu.py > $R/gpu_tests_1.log 2>&1 &
wait
tail -n 4 $R/gpu_tests_0.log; tail -n 4 $R/gpu_tests_1.log; echo "done at $(el) s"
