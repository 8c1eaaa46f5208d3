#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): the shipped change (contiguous decode 3 stages as before, paged decode 2 stages):
# the exact / matched GPU tests, then the matched rollout at the 8K batch decoding from the paged pool.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8c; mkdir -p $R
pack() { tar czf $OUT/s8_call7.tgz -C /tmp s8c; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_batch_invariant_gpu.py \
  tests/gpu/test_paged_exact_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $?" >> $R/rc.txt
timeout 300 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 32 --prompt-len 7680 \
  --gen-len 512 --presets jetrl_kv --modes matched --continuous-batching --out $R/rollout_8k_paged.json \
  > $R/rollout_8k_paged.log 2>&1
echo "rollout8k paged rc $?" >> $R/rc.txt
cat $R/rc.txt; tail -n 3 $R/gpu_tests.log; tail -n 7 $R/rollout_8k_paged.log
