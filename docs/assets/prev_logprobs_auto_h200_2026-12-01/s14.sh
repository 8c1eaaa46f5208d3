#!/usr/bin/env bash
# 2026-12-01 session 14 (one H200 per machine): the shipped recipes through the CLI, with prev_logprobs_source: auto
# (train_forward) as the new default; JOBS = "shape:variant ..." in order (shape 1p7b | 8b; variant bf16 | fp8_kv),
# each run under its own timeout; TAG names the tarball.
set -u
TAG=${TAG:-a1}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s14_$TAG; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s14_$TAG.tgz -C /tmp s14_$TAG; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,serial --format=csv > $R/gpu.txt 2>&1
hostname >> $R/gpu.txt; date >> $R/gpu.txt
for job in $JOBS; do
  shape=${job%%:*}; v=${job##*:}; t0=$(date +%s)
  if [ "$shape" = 8b ]; then
    SHAPE=qwen3-8b RECIPE=grpo_math_8B STEPS=4 COPY_TO=$R/8b EXTRA="policy.master_dtype=bfloat16 grpo.num_prompts_per_step=8" \
      timeout ${T8:-420} bash benchmarks/gpu_cli_run.sh /tmp/g8 build $v > $R/8b_$v.run.log 2>&1
  else
    STEPS=6 COPY_TO=$R/1p7b timeout ${T17:-150} bash benchmarks/gpu_cli_run.sh /tmp/g17 build $v > $R/1p7b_$v.run.log 2>&1
  fi
  rc=$?; echo "$job rc $rc in $(( $(date +%s) - t0 )) s"
  d=$R/$shape; [ $shape = 8b ] && g=/tmp/g8 || g=/tmp/g17
  [ -f $g/build.log ] && cp $g/build.log $R/${shape}_build.log
  python3 -m benchmarks.gpu_cli_report $v=$d/$v > $R/${shape}_$v.report.md 2>&1
  grep -E "total_step_time|decode \||logprobs \||training \||timed steps|token_mult|exact_token" $R/${shape}_$v.report.md
  grep -h "matched_kernels:\|prev_logprobs\|GRPO done" $d/$v.log | head -4
  [ $rc -ne 0 ] && [ "${STOP_ON_FAIL:-1}" = 1 ] && { echo "stopping after a failed run"; exit 1; }
done
exit 0
