#!/usr/bin/env bash
# 2026-12-01 session 10 call 8: compiled variants of the exact attention as widths change class (probe 11).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c8; mkdir -p $R
pack() { cp $0 .gpu/probe11.py $R/; tar czf $OUT/s10_call8.tgz -C /tmp s10c8; }
trap pack EXIT
OUT=$R timeout 70 python3 .gpu/probe11.py > $R/probe11.log 2>&1; echo "probe11 rc $?"
grep -v -i warn $R/probe11.log | cut -c1-400
