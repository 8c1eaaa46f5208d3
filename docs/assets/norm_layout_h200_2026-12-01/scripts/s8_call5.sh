#!/usr/bin/env bash
# 2026-12-01 session 8 (1 x H200): the fused norm + FP8 cast against the plain norm + act_quant at 1,024-5,120 wide
# rows, FP32 and BF16 master weights, with and without a delta: the landed store runs (the test), then the store
# seen contiguous over 16 columns as before (the test with _norm_store_run patched to 16: which cases fail).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s8e; mkdir -p $R
pack() { cp $0 .gpu/old_store_plugin.py $R/ 2>/dev/null; tar czf $OUT/s8_call5.tgz -C /tmp s8e; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -v -n 0 -p no:cacheprovider tests/gpu/test_fused_rollout_gpu.py -k "fused_norm_fp8_equals" > $R/landed.log 2>&1
echo "landed rc $?"; tail -n 1 $R/landed.log
timeout 150 python3 -m pytest -v -n 0 -p no:cacheprovider -p old_store_plugin tests/gpu/test_fused_rollout_gpu.py -k "fused_norm_fp8_equals" > $R/old_store.log 2>&1
echo "old store rc $?"; grep -E " PASSED| FAILED" $R/old_store.log | sed 's/.*:://' | cut -c1-100; tail -n 1 $R/old_store.log
