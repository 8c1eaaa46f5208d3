#!/usr/bin/env bash
# 2026-12-01 session 11 call E (1 x H200, fresh): the shipped 1.7B FP8+KV recipe (fast path) alone, 5 steps, the
# generation phase of step 4 profiled with its trace: the fast prefill's spikes at steps 3-5 of a machine's first run.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s11e; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; cp -r /tmp/g17/logs/fp8_kv/profile $R/ 2>/dev/null; tar czf $OUT/s11_e.tgz -C /tmp s11e; }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
NEMO_JETRL_PROFILE="generation@4" NEMO_JETRL_PROFILE_TRACE=1 TRITON_COMPILE_LOG=$R/compile.log STEPS=5 COPY_TO=$R/r \
  EXTRA="policy.generation.stop_token_ids=[]" timeout 300 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv > $R/run.log 2>&1
echo "rc $?"
python3 /dev/stdin <<'PY'
import json
for l in open("/tmp/s11e/r/fp8_kv/metrics.jsonl"):
    r = json.loads(l)
    if "timing/total_step_time" in r:
        print(r["step"], *(f"{k.split('/')[-1]} {r['timing/' + k]:.2f}" for k in ("total_step_time", "generation", "generation/prefill", "generation/decode")))
PY
ls /tmp/g17/logs/fp8_kv/profile/
timeout 120 python3 -m benchmarks.trace_gaps /tmp/g17/logs/fp8_kv/profile/step4_generation.trace.json.gz > $R/gaps.txt 2>&1; head -40 $R/gaps.txt
