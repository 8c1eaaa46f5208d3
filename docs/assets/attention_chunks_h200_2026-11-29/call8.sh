#!/usr/bin/env bash
# call 8 (1 x H200): the exact attention's keys in chunks (decode chunks in parallel programs): kernel timings at
# the 1.7B / 8B shapes (fast, chunked, one chunk), then the GPU tests of the exact paths' bits
set -u
export PYTHONUNBUFFERED=1
[ -d /tmp/site/omegaconf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m benchmarks.bench_batch_invariant_kernels --shapes --out $OUT/bi_chunks.json > $OUT/bench.log 2>&1; echo "bench rc=$? at $(el) s"
grep -E "^\|" $OUT/bench.log | head -40
timeout $(( 285 - $(el) )) python3 -m pytest -q -p no:cacheprovider -n 0 -rs tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_matched_packing_gpu.py -k "attention or packed or self_check" > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $(el) s"
grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests.log | head -20
