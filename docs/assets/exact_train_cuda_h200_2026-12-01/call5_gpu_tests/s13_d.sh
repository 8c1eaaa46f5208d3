#!/usr/bin/env bash
# 2026-12-01 session 13 call D (one H200): the exact-path GPU tests with the final CUDA trainer forward.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s13d; mkdir -p $R
pack() { cp $0 $R/ 2>/dev/null; tar czf $OUT/s13_d.tgz -C /tmp s13d; }
trap pack EXIT
timeout 190 python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_batch_invariant_gpu.py \
  tests/gpu/test_matched_packing_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $?"; tail -6 $R/gpu_tests.log
