#!/usr/bin/env bash
# The whole GPU test suite (tests/gpu) spread over the machine's GPUs in one device call: one lane per GPU, each lane
# running its share of the test files one after another (files by their usual length, longest first, dealt round
# robin), the 2-GPU torchrun test on the first two GPUs after lane 0 and 1 finish. Prints one line per file and a
# summary; logs in OUT_DIR/<file>.log.
#
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_suite.sh OUT_DIR [DEADLINE_S]
#
# DEADLINE_S (default 560): every file still running then is stopped (reported as "timeout"). NCCL's NVLink
# multicast stays off (docs/cluster.md). GPU_SUITE_FILES="test_a test_b" runs only those files, in that order (a
# device call too short for the whole suite on one GPU runs it in parts).
set -u
OUT=${1:?usage: bash benchmarks/gpu_suite.sh OUT_DIR [DEADLINE_S]}
DEADLINE=${2:-560}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$GPUS" -ge 1 ] || { echo "gpu_suite: no GPU"; exit 2; }
# longest first (measured order of magnitude, H200): dealing them round robin balances the lanes
FILES=(test_grpo_gpu test_accuracy_long_gpu test_continuous_batching_gpu test_paged_exact_gpu test_train_graphs_gpu
       test_fp8_train_step_gpu test_matched_packing_gpu test_moe_gpu test_activation_checkpointing_gpu
       test_generation_gpu test_cuda_graph_decode test_batch_invariant_gpu test_fused_train_gpu test_fused_rollout_gpu
       test_fused_logprobs_gpu test_packing_gpu test_precision_gpu test_recipes_gpu test_validation_reference_gpu
       test_tune_cache_gpu test_deep_gemm_gpu test_sdpa_backends_gpu test_exact_decode_cuda_gpu test_exact_train_cuda_gpu)
listed=$(printf '%s\n' "${FILES[@]}" test_torchrun_gpu | sort)
present=$(ls tests/gpu | sed -n 's/^\(test_.*\)\.py$/\1/p' | sort)
if [ "$listed" != "$present" ]; then
    echo "gpu_suite: the file list differs from tests/gpu:"; diff <(echo "$listed") <(echo "$present"); exit 2
fi
if [ -n "${GPU_SUITE_FILES:-}" ]; then
    for f in $GPU_SUITE_FILES; do
        [ -f "tests/gpu/$f.py" ] || { echo "gpu_suite: no tests/gpu/$f.py"; exit 2; }
    done
    read -r -a FILES <<< "${GPU_SUITE_FILES//test_torchrun_gpu/}"
    [[ " $GPU_SUITE_FILES " == *" test_torchrun_gpu "* ]] || TORCHRUN=no
fi
t0=$(date +%s)
run_file() {  # run_file GPU(S) NAME
    local left=$(( DEADLINE - ($(date +%s) - t0) ))
    [ "$left" -gt 5 ] || { echo "$2: not started (deadline)"; return; }
    CUDA_VISIBLE_DEVICES=$1 timeout "$left" python3 -m pytest -q -p no:cacheprovider -n 0 --tb=short -rf \
        "tests/gpu/$2.py" > "$OUT/$2.log" 2>&1
    local rc=$? summary
    summary=$(grep -E "passed|failed|skipped|error" "$OUT/$2.log" | tail -1)
    [ $rc -eq 124 ] && summary="timeout after ${left} s"
    echo "$2 [GPU $1, $(( $(date +%s) - t0 )) s]: rc=$rc ${summary}"
}
lane() {  # lane INDEX: every GPUS-th file from INDEX
    local i
    for (( i = $1; i < ${#FILES[@]}; i += GPUS )); do run_file "$1" "${FILES[$i]}"; done
}
for (( g = 0; g < GPUS; g++ )); do lane "$g" & pids[$g]=$!; done
if [ "${TORCHRUN:-yes}" = no ]; then
    :
elif [ "$GPUS" -ge 2 ]; then
    wait "${pids[0]}" "${pids[1]}"
    run_file 0,1 test_torchrun_gpu
else
    echo "test_torchrun_gpu: skipped (one GPU)"
fi
wait
failing=$(grep -lE "[0-9]+ failed|error" "$OUT"/*.log 2>/dev/null | wc -l)
echo "gpu_suite: $failing file(s) with failures, $(( $(date +%s) - t0 )) s"
