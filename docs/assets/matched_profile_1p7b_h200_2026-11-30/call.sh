#!/usr/bin/env bash
# 2026-11-30 session 6 (1 x H200): where the matched rollout's time goes at the 1.7B CLI shape today (128 rows,
# 180 -> 512 tokens): fast vs matched (attention+logsumexp+cublas), 5 alternating rounds, a kernel profile of 3
# eager decode steps each, and the same with a CUDA-graph device-time view via nsys-less torch profiler.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s6c; mkdir -p $R
pack() { tar czf $OUT/s6_call3.tgz -C /tmp s6c; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
timeout 420 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 128 --prompt-len 180 \
  --gen-len 512 --presets jetrl_kv --modes attention+logsumexp+cublas --profile-steps 3 --out $R/matched_1p7b_profile.json \
  > $R/matched_1p7b_profile.log 2>&1
echo "rc $?"; grep -v Warning $R/matched_1p7b_profile.log | tail -n 60
