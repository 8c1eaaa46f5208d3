#!/usr/bin/env bash
# 2026-11-30 session 3, call c (a fresh 2 x H200 machine, carry .whl .gpu): issue 43's 8K pair once more, 4 steps
# each (BF16 on GPU 0, FP8+KV on GPU 1); after it GPU 1 runs the shipped grpo_math_8B pair at 512 tokens (FP8+KV then
# BF16, 5 steps each, after the sampler's sync fix) and GPU 0 the matched kernels' cost (bench_grpo_step, 1.7B shape,
# after the padding change), each cut off before the call's end.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1
R=/tmp/resc; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { pkill -f run_grpo.py; pkill -f bench_grpo_step; sleep 2; tar czf $OUT/resc.tgz -C /tmp resc; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,pci.bus_id --format=csv > $R/gpu.txt; cat $R/gpu.txt
hostname > $R/host.txt; nproc >> $R/host.txt; grep -m1 "model name" /proc/cpuinfo >> $R/host.txt
D=/tmp/l8; X="grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=8704 policy.generation.max_new_tokens=8192 grpo.mismatch_position_bin=1024"
bash benchmarks/gpu_cli_run.sh $D check build > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
echo "build ready at $(el) s"
( CUDA_VISIBLE_DEVICES=0 GPU=0 STEPS=4 EXTRA="$X" COPY_TO=$R/r8k timeout 470 bash benchmarks/gpu_cli_run.sh $D bf16 > $R/stage_bf16.log 2>&1
  echo "8K bf16 (GPU 0) rc $? at $(el) s"
  CUDA_VISIBLE_DEVICES=0 timeout $(( 568 - $(el) )) python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 \
    --prompts 128 --prompt-len 180 --gen-len 512 --micro-batch 4 --steps 5 --variants "fp8+kv" "fp8+kv matched" \
    --train-cuda-graphs --packing --out $R/matched_1p7b.json > $R/matched_1p7b.log 2>&1
  echo "matched bench (GPU 0) rc $? at $(el) s"; tail -5 $R/matched_1p7b.log ) &
p0=$!
sleep 5
CUDA_VISIBLE_DEVICES=1 GPU=1 STEPS=4 EXTRA="$X" COPY_TO=$R/r8k timeout 400 bash benchmarks/gpu_cli_run.sh $D fp8_kv > $R/stage_fp8.log 2>&1
echo "8K fp8_kv (GPU 1) rc $? at $(el) s"
X8="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8 policy.generation.max_new_tokens=512"
CUDA_VISIBLE_DEVICES=1 SHAPE=qwen3-8b RECIPE=grpo_math_8B bash benchmarks/gpu_cli_run.sh /tmp/g8 build > $R/build8b.log 2>&1; echo "8B build rc=$? at $(el) s"
for V in fp8_kv bf16; do
  [ $(el) -gt 470 ] && break
  CUDA_VISIBLE_DEVICES=1 GPU=1 SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=5 EXTRA="$X8" COPY_TO=$R/r8b \
    timeout $(( 570 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g8 $V > $R/8b_$V.log 2>&1
  echo "8B $V (GPU 1) rc $? at $(el) s"
done
wait $p0
grep -hE "^error|Traceback" $R/*.log | head -6
python3 -m benchmarks.gpu_cli_report bf16=$R/r8k/bf16 fp8_kv=$R/r8k/fp8_kv --baseline bf16 2>&1 | tee $R/report_8k.md | grep -E "total_step|decode|timed|peak GPU"
python3 -m benchmarks.gpu_cli_report bf16=$R/r8b/bf16 fp8_kv=$R/r8b/fp8_kv --baseline bf16 2>&1 | tee $R/report_8b.md | grep -E "total_step|generation |training|logprobs|timed"
