#!/usr/bin/env bash
# 2026-12-01 session 12 call B (one H200): the exact-path GPU tests with the CUDA exact decode, then the shipped
# 1.7B FP8+KV recipe fast then matched through the CLI (one GPU, one after the other), 6 steps each.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s12b; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s12_b.tgz -C /tmp s12b; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 270 python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_exact_decode_cuda_gpu.py \
  tests/gpu/test_paged_exact_gpu.py tests/gpu/test_batch_invariant_gpu.py -x > $R/gpu_tests.log 2>&1
echo "tests rc $?"; tail -4 $R/gpu_tests.log
STEPS=6 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" \
  timeout 250 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv fp8_kv_matched > $R/run.log 2>&1
echo "cli rc $?"
python3 -m benchmarks.gpu_cli_report fast=$R/r/fp8_kv matched=$R/r/fp8_kv_matched --baseline fast > $R/report.md 2>&1
grep -E "total_step_time|decode \||prefill \||logprobs \||training \||timed steps|token_mult|exact_token" $R/report.md
