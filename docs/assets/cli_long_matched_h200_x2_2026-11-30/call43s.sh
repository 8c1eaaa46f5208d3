#!/usr/bin/env bash
# issue 43 (2 x H200): 1.7B shape, 16K-token responses (1 prompt x 8), the shipped FP8+KV recipe fast (GPU 0)
# against matched_kernels=auto (GPU 1), side by side, up to 2 steps each in ~270 s, mismatch by 2,048-position bins
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
[ -d /tmp/site/omegaconf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
D=/tmp/l16; X="grpo.num_prompts_per_step=1 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=16896 policy.generation.max_new_tokens=16384 grpo.mismatch_position_bin=2048"
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
[ -f $D/ckpt/build_info.json ] || CUDA_VISIBLE_DEVICES=0 bash benchmarks/gpu_cli_run.sh $D check build > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "build ready at $(el) s"
L=$(( 265 - $(el) ))
CUDA_VISIBLE_DEVICES=0 GPU=0 STEPS=2 EXTRA="$X" timeout $L bash benchmarks/gpu_cli_run.sh $D fp8_kv > $OUT/stage_fast.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 GPU=1 STEPS=2 EXTRA="$X" timeout $L bash benchmarks/gpu_cli_run.sh $D fp8_kv_matched > $OUT/stage_matched.log 2>&1 &
wait; echo "runs done at $(el) s"
for v in fp8_kv fp8_kv_matched; do mkdir -p $OUT/r/$v; cp $D/$v.log $OUT/r/ 2>/dev/null; cp $D/logs/$v/{metrics.jsonl,config.yaml,gpu_memory.csv} $OUT/r/$v/ 2>/dev/null; done
grep -hE "preflight:|auto ->|^error|Error|Traceback" $OUT/stage_*.log $OUT/r/*.log | head -12
python3 -m benchmarks.gpu_cli_report fp8_kv=$OUT/r/fp8_kv fp8_kv_matched=$OUT/r/fp8_kv_matched --skip 0 2>&1 | tail -45
