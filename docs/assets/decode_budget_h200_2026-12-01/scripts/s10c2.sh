#!/usr/bin/env bash
# 2026-12-01 session 10 call 2: the contiguous exact decode under a register budget (probe 9).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c2; mkdir -p $R
pack() { cp $0 .gpu/probe9.py $R/; tar czf $OUT/s10_call2.tgz -C /tmp s10c2; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 400 python3 .gpu/probe9.py > $R/probe9.log 2>&1; echo "probe9 rc $?" >> $R/rc.txt
grep -v -i warn $R/probe9.log | cut -c1-900; cat $R/rc.txt
