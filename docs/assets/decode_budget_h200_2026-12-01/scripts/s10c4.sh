#!/usr/bin/env bash
# 2026-12-01 session 10 call 4: the chunked batch-invariant FP8 GEMM at decode and trainer rows (probe).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c4; mkdir -p $R
pack() { cp $0 .gpu/chunked_gemm.py $R/; tar czf $OUT/s10_call4.tgz -C /tmp s10c4; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 400 python3 .gpu/chunked_gemm.py > $R/chunked.log 2>&1; echo "chunked rc $?" >> $R/rc.txt
grep -v -i warn $R/chunked.log | cut -c1-1200; cat $R/rc.txt
