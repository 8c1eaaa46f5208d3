#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): the FP32 fused-norm case alone (norm_case.py), then bench_batch_invariant_kernels
# --shapes with the decode configs beside the defaults.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8b; mkdir -p $R
pack() { cp .gpu/norm_case.py $0 $R/ 2>/dev/null; tar czf $OUT/s8_call2.tgz -C /tmp s8b; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 100 python3 .gpu/norm_case.py .gpu/bad_case_plain.pt > $R/norm_case.log 2>&1; echo "case rc $?"; cat $R/norm_case.log | head -90
timeout 240 python3 -m benchmarks.bench_batch_invariant_kernels --shapes --configs 16,4,2 16,4,3 16,4,4 --out $R/bik_shapes.json > $R/bik_shapes.log 2>&1
echo "bench rc $?"; tail -n 30 $R/bik_shapes.log
