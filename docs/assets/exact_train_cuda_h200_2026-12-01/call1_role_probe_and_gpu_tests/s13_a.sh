#!/usr/bin/env bash
# 2026-12-01 session 13 call A (one H200): mma.sync role-symmetry probe; the exact-path GPU tests after the
# dispatch refactor (not GPU-run since), and the GRPO driver test with matched auto.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s13a; mkdir -p $R
pack() { cp $0 $R/ 2>/dev/null; tar czf $OUT/s13_a.tgz -C /tmp s13a; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 60 python3 .gpu/role_probe.py 2>&1 | tee $R/role_probe.log
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_exact_decode_cuda_gpu.py \
  tests/gpu/test_paged_exact_gpu.py tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_matched_packing_gpu.py \
  tests/gpu/test_grpo_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $?"; tail -6 $R/gpu_tests.log
