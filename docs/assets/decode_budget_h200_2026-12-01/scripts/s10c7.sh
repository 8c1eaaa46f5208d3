#!/usr/bin/env bash
# 2026-12-01 session 10 call 7: the exact attention without alignment specialization of its lengths (probe 10), then
# the GPU tests of the exact attention.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c7; mkdir -p $R
pack() { cp $0 .gpu/probe10.py $R/; tar czf $OUT/s10_call7.tgz -C /tmp s10c7; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 90 python3 .gpu/probe10.py > $R/probe10.log 2>&1; echo "probe10 rc $?"
grep -v -i warn $R/probe10.log | cut -c1-400
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_paged_exact_gpu.py \
  > $R/gpu_tests.log 2>&1; echo "tests rc $?"
grep -E "FAILED|ERROR" $R/gpu_tests.log | head; tail -n 1 $R/gpu_tests.log
