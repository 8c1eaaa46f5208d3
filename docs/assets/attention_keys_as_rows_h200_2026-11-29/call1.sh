#!/bin/bash
# call 1: swapped-orientation exact attention: kernel shapes, bitwise GPU tests, matched rollout at 1.7B
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee $OUT/gpu.txt
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)" | tee -a $OUT/gpu.txt
timeout 150 python3 -m benchmarks.bench_batch_invariant_kernels --shapes --configs 16,4,2 32,4,3 64,4,2 64,4,3 128,4,2 --out $OUT/shapes.json 2>&1 | tee $OUT/shapes.log | grep -v "^{" 
timeout 260 python3 -m pytest -q -p no:cacheprovider tests/unit/models/test_batch_invariant_compiled.py tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_paged_exact_gpu.py tests/gpu/test_matched_packing_gpu.py 2>&1 | tee $OUT/tests.log | tail -30
timeout 150 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 128 --prompt-len 128 --gen-len 512 --presets jetrl_kv --modes attention+logsumexp+cublas --steps 5 --out $OUT/rollout_1p7b.json 2>&1 | tee $OUT/rollout.log | tail -15
