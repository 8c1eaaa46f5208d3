#!/usr/bin/env bash
# session 2026-11-28b call A (4 x H200): GPU0 test_moe_gpu with tracebacks, then the i42 GPU test list;
# GPU1 MoE mismatch matched/exact/tensorwise; GPUs 2,3 MoE rollout 48 layers 512 -> 2,048 (2 alternating rollouts each).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=$OUT/r; mkdir -p $R /tmp/b
finish() { cp /tmp/b/*.json /tmp/b/*.png $R/ 2>/dev/null; tar czf $OUT/callA.tgz -C $R . ; rm -rf $R; }
trap finish EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
( export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_moe_gpu.py > $R/moe_gpu.log 2>&1; echo "moe gpu rc=$? at $(el) s"; grep -E "^E |passed|failed|Error" $R/moe_gpu.log | head -30
  timeout $(( 575 - $(el) )) python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf tests/gpu/test_fp8_train_step_gpu.py tests/gpu/test_grpo_gpu.py tests/gpu/test_matched_packing_gpu.py tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_paged_exact_gpu.py tests/gpu/test_cuda_graph_decode.py tests/gpu/test_train_graphs_gpu.py tests/gpu/test_continuous_batching_gpu.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $(el) s"; grep -E "^FAILED|passed|failed" $R/gpu_tests.log | tail -12 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 575 python3 -m benchmarks.bench_mismatch --shape qwen3-30b-a3b --layers 8 --steps 1 --variants "jetrl, matched" "jetrl, exact" "jetrl_kv, exact" "unified fp8 tensorwise" --out /tmp/b/moe_mismatch2.json > $R/moe_mismatch2.log 2>&1; echo "moe mismatch rc=$? at $(el) s"; tail -14 $R/moe_mismatch2.log ) &
for g in 2 3; do ( CUDA_VISIBLE_DEVICES=$g timeout 580 python3 -m benchmarks.bench_rollout --shape qwen3-30b-a3b --batch 128 --prompt-len 512 --gen-len 2048 --repeats 2 --eager-steps 0 --variants bf16,fp8+kv --out /tmp/b/moe_rollout_2048_gpu$g.json > $R/moe_rollout_gpu$g.log 2>&1; echo "moe rollout gpu$g rc=$? at $(el) s"; tail -8 $R/moe_rollout_gpu$g.log ) & done
wait
