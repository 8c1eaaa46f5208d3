#!/usr/bin/env bash
# 2026-12-01 session 10 call 1: decode GEMMs that give cuBLAS's trainer bits (probe), then the matched rollout's
# kernel profile at the 1.7B shape on today's code.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s10c1; mkdir -p $R
pack() { cp $0 .gpu/gemm_bits.py $R/; tar czf $OUT/s10_call1.tgz -C /tmp s10c1; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
OUT=$R timeout 300 python3 .gpu/gemm_bits.py > $R/gemm_bits.log 2>&1; echo "gemm_bits rc $?" >> $R/rc.txt
grep -v -i warn $R/gemm_bits.log | cut -c1-1500
timeout 200 python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0 --batch 128 --prompt-len 180 \
  --gen-len 512 --presets jetrl_kv --modes matched --profile-steps 3 > $R/profile.log 2>&1; echo "profile rc $?" >> $R/rc.txt
cat $R/rc.txt; tail -n 40 $R/profile.log | cut -c1-300
