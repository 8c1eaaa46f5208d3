#!/usr/bin/env bash
# 2026-12-01 session 7 (2 x H200): GPU 0: the matched rollout with the exact attention's keys in chunks of 1024 /
# 512 / 256 / 128 (.gpu/split_sweep.py). GPU 1: the GPU tests call 1 cut short (GRPO, paged exact, fused rollout,
# continuous batching), with time enough.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s7b; mkdir -p $R
pack() { tar czf $OUT/s7_call2.tgz -C /tmp s7b; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
(CUDA_VISIBLE_DEVICES=0 timeout 400 python3 .gpu/split_sweep.py $R/split_sweep.json > $R/split_sweep.log 2>&1; echo "sweep rc $?" >> $R/rc.txt) &
(CUDA_VISIBLE_DEVICES=1 timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_grpo_gpu.py tests/gpu/test_paged_exact_gpu.py \
    tests/gpu/test_fused_rollout_gpu.py tests/gpu/test_continuous_batching_gpu.py > $R/gpu_tests_1.log 2>&1; echo "tests1 rc $?" >> $R/rc.txt) &
wait
cat $R/rc.txt
grep -v Warning $R/split_sweep.log | tail -n 20
tail -n 3 $R/gpu_tests_1.log; grep -hE "FAILED|Error" $R/gpu_tests_*.log | head -20
