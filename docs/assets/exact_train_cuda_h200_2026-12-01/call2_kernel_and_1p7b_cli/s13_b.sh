#!/usr/bin/env bash
# 2026-12-01 session 13 call B (one H200): the CUDA exact trainer forward: GPU tests, its time beside SDPA and the
# Triton kernel at the trainer shapes; then the shipped 1.7B recipes BF16 then FP8+KV (matched by default), 6 steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s13b; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s13_b.tgz -C /tmp s13b; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_exact_train_cuda_gpu.py \
  tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_matched_packing_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $?"; tail -8 $R/gpu_tests.log
# (the call ran the lines of ../train_shapes.py here as an inline script)
timeout 90 python3 .gpu/train_shapes.py > $R/train_shapes.log 2>&1
echo "bench rc $?"; cat $R/train_shapes.log | tail -16
STEPS=6 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" \
  timeout 270 bash benchmarks/gpu_cli_run.sh /tmp/g17 build bf16 fp8_kv > $R/run.log 2>&1
echo "cli rc $?"
python3 -m benchmarks.gpu_cli_report bf16=$R/r/bf16 fp8_kv=$R/r/fp8_kv --baseline bf16 > $R/report.md 2>&1
grep -E "total_step_time|generation \||logprobs \||training \||timed steps|token_mult|exact_token" $R/report.md
grep -h "matched_kernels\|exact attention" $R/r/fp8_kv.log | head -3
