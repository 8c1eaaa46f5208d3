#!/usr/bin/env bash
# 2026-12-01 session 10 call 6 (another machine): the CLI pair in the other order (matched first, then the fast
# run; the shipped 1.7B FP8+KV recipe, equal lengths) after a 2-step warm-up of the fast run, compiles logged; then the
# 8B-shape GRPO step fast vs matched (performance.md's command).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c6; mkdir -p $R/compiles
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s10_call6.tgz -C /tmp s10c6; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
STEPS=2 COPY_TO=$R/warm EXTRA="policy.generation.stop_token_ids=[]" timeout 110 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv > $R/warm.log 2>&1
echo "warm-up rc $?"
TRITON_COMPILE_LOG=$R/compiles/log STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 230 bash benchmarks/gpu_cli_run.sh /tmp/g17 fp8_kv_matched fp8_kv > $R/run.log 2>&1
echo "cli rc $?"
grep -hE "matched_kernels: auto|token_mult_prob_error" $R/r/*.log | head -6
python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fp8_kv > $R/report.md 2>&1
grep -E "total_step_time|decode \||timed steps|token_mult|exact_token" $R/report.md | head -20
timeout 200 python3 -m benchmarks.bench_grpo_step --shape qwen3-8b --layers 8 --prompts 64 --prompt-len 256 \
  --gen-len 768 --micro-batch 8 --steps 5 --variants "fp8+kv" "fp8+kv matched" --train-cuda-graphs --packing \
  --out $R/grpo_8b.json > $R/grpo_8b.log 2>&1; echo "grpo8b rc $?"
tail -n 4 $R/grpo_8b.log | cut -c1-250
