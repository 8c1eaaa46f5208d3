#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): the exact attention's key block 64 vs 128 (probe), the FP32 fused-norm diagnostic
# (plain and mul.rn squares), then the exact paths' GPU tests with the key block at 128.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8a; mkdir -p $R
pack() { cp .gpu/block_probe.py .gpu/bn128_plugin.py .gpu/fp32_norm_diag.py $0 $R/ 2>/dev/null; tar czf $OUT/s8_call1.tgz -C /tmp s8a; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 220 python3 .gpu/block_probe.py > $R/block_probe.log 2>&1; echo "probe rc $?"; tail -n 8 $R/block_probe.log | cut -c1-600
for sq in plain mulrn; do
  OUT=$R timeout 120 python3 .gpu/fp32_norm_diag.py --squares $sq > $R/diag_$sq.log 2>&1; echo "diag $sq rc $?"
  grep -E "fraction|equal|differing|with any" $R/diag_$sq.log | head -8
  [ -f $R/bad_case.pt ] && mv $R/bad_case.pt $R/bad_case_$sq.pt
done
timeout 200 python3 -m pytest -q -p no:cacheprovider -p bn128_plugin tests/gpu/test_batch_invariant_gpu.py \
  tests/gpu/test_paged_exact_gpu.py tests/gpu/test_matched_packing_gpu.py > $R/bn128_tests.log 2>&1
echo "bn128 tests rc $?"; tail -n 3 $R/bn128_tests.log; grep -hE "FAILED|Error|bn128_plugin" $R/bn128_tests.log | head
