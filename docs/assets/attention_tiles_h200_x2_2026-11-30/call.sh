#!/usr/bin/env bash
# issue 44 (2 x H200): the trainer's exact tile at 32 / 16 rows: timings on GPU 0 while the bit tests run on GPU 1
# with TRAIN_CONFIG = (32, 4, 3)
set -u
[ -d /tmp/site/omegaconf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
(CUDA_VISIBLE_DEVICES=1 timeout 420 python3 -c "
import sys, pytest, nemo_jetrl.models.batch_invariant_kernels as K
K.TRAIN_CONFIG = (32, 4, 3)
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-n', '0', '-rs', 'tests/gpu/test_batch_invariant_gpu.py', 'tests/gpu/test_matched_packing_gpu.py', 'tests/gpu/test_paged_exact_gpu.py']))
" > $OUT/gpu_tests_32.log 2>&1; echo "gpu tests (TRAIN_CONFIG 32,4,3) rc=$?" >> $OUT/gpu_tests_32.log) &
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.bench_batch_invariant_kernels --shapes --configs 32,4,3 16,4,3 --out $OUT/bi_tiles.json > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -v "^$" $OUT/bench.log | cut -c1-260 | tail -70
wait
tail -5 $OUT/gpu_tests_32.log
