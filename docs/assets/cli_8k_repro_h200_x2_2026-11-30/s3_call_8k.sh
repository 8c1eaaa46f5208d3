#!/usr/bin/env bash
# 2026-11-30 session 3, issue 43 (2 x H200, carry .whl .gpu): the 1.7B shape's 8K-token CLI pair side by side on the
# host's two GPUs, 5 steps each (steps 2-5 timed). ORDER=a: BF16 on GPU 0, FP8+KV on GPU 1; ORDER=b: swapped.
# After the FP8+KV run, its GPU runs bench_rollout_syncs (ORDER=a) or the padded cuBLAS rows' bit test (ORDER=b).
# ORDER=b takes 4 steps (steps 2-4 timed) to leave device time for a third call.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1
ORDER=${ORDER:-a}; R=/tmp/res8k_$ORDER; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { pkill -f run_grpo.py; sleep 2; tar czf $OUT/res8k_$ORDER.tgz -C /tmp res8k_$ORDER; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt; cat $R/gpu.txt
D=/tmp/l8; X="grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=8 policy.max_total_sequence_length=8704 policy.generation.max_new_tokens=8192 grpo.mismatch_position_bin=1024"
bash benchmarks/gpu_cli_run.sh $D check build > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
echo "build ready at $(el) s"
if [ $ORDER = a ]; then GB=0; GF=1; N=5; else GB=1; GF=0; N=4; fi
CUDA_VISIBLE_DEVICES=$GB GPU=$GB STEPS=$N EXTRA="$X" COPY_TO=$R/r timeout 520 bash benchmarks/gpu_cli_run.sh $D bf16 > $R/stage_bf16.log 2>&1 &
pb=$!
sleep 5
CUDA_VISIBLE_DEVICES=$GF GPU=$GF STEPS=$N EXTRA="$X" COPY_TO=$R/r timeout 500 bash benchmarks/gpu_cli_run.sh $D fp8_kv > $R/stage_fp8.log 2>&1
echo "fp8_kv (GPU $GF) rc $? at $(el) s"
if [ $ORDER = a ]; then
  CUDA_VISIBLE_DEVICES=$GF timeout $(( 540 - $(el) )) python3 -m benchmarks.bench_rollout_syncs --out $R/rollout_syncs.json > $R/rollout_syncs.log 2>&1
  echo "rollout_syncs rc $? at $(el) s"; tail -20 $R/rollout_syncs.log
else
  CUDA_VISIBLE_DEVICES=$GF timeout 150 python3 -m pytest -q -n 0 -p no:cacheprovider tests/gpu/test_batch_invariant_gpu.py -k "cublas_fp8_row" > $R/padded_bits.log 2>&1
  echo "padded bits test rc $? at $(el) s"; tail -4 $R/padded_bits.log
fi
wait $pb; echo "bf16 (GPU $GB) rc $? at $(el) s"
grep -hE "^error|Traceback|preflight" $R/stage_*.log | head -6
python3 -m benchmarks.gpu_cli_report bf16=$R/r/bf16 fp8_kv=$R/r/fp8_kv --baseline bf16 2>&1 | tee $R/report.md | head -40
