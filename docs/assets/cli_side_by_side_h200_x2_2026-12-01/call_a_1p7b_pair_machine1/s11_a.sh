#!/usr/bin/env bash
# 2026-12-01 session 11 call A (2 x H200): the shipped 1.7B FP8+KV recipe fast vs matched_kernels=auto, side by
# side (one GPU each), 6 steps, equal lengths; then again with the GPUs swapped. Triton compiles logged.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s11a; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s11_a.tgz -C /tmp s11a; }
trap pack EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
for P in "0 1" "1 0"; do
  S=_g${P// /}
  TRITON_COMPILE_LOG=$R/compile$S.log SUFFIX=$S PAIR_GPUS="$P" PAIR_VARIANTS="fp8_kv fp8_kv_matched" STEPS=6 \
    COPY_TO=$R/r$S EXTRA="policy.generation.stop_token_ids=[]" \
    timeout 260 bash benchmarks/gpu_cli_run.sh /tmp/g17 build side_by_side > $R/run$S.log 2>&1
  echo "pair $S rc $? at $(el) s"
  python3 -m benchmarks.gpu_cli_report fp8_kv=$R/r$S/fp8_kv$S matched=$R/r$S/fp8_kv_matched$S --baseline fp8_kv > $R/report$S.md 2>&1
  grep -E "total_step_time|decode \||prefill \||training \||timed steps|token_mult" $R/report$S.md
done
