#!/usr/bin/env bash
# 2026-12-01 session 13 call C (one H200): the CUDA exact trainer forward with its unmasked fast path: GPU tests and
# the trainer shapes beside SDPA and the Triton kernel; then the shipped grpo_math_8B FP8+KV recipe (matched by
# default) at its 4,096 tokens, 8 prompts x 8, BF16 master, 4 steps (V=bf16 for the BF16 recipe and no tests).
set -u
V=${V:-fp8_kv}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s13c_$V; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s13_c_$V.tgz -C /tmp s13c_$V; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
if [ "$V" != bf16 ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_exact_train_cuda_gpu.py > $R/gpu_tests.log 2>&1
  echo "tests rc $?"; tail -5 $R/gpu_tests.log
  timeout 90 python3 .gpu/train_shapes.py > $R/train_shapes.log 2>&1
  echo "bench rc $?"; grep -v "one chunk" $R/train_shapes.log | tail -12
fi
SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=4 COPY_TO=$R/r EXTRA="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8" \
  timeout 400 bash benchmarks/gpu_cli_run.sh /tmp/g8 build $V > $R/run.log 2>&1
echo "rc $?"
python3 -m benchmarks.gpu_cli_report $V=$R/r/$V > $R/report.md 2>&1
grep -E "total_step_time|decode \||logprobs \||training \||timed steps|token_mult|exact_token" $R/report.md
grep -h "matched_kernels:\|exact attention" $R/r/$V.log | head -3
