#!/usr/bin/env bash
# 2026-12-01 session 11 call F (1 x H200, fresh): masked CUDA SDPA without cuDNN. The shipped 1.7B FP8+KV recipe
# (fast path) alone as a machine's first run, 5 steps (the prefill spikes of steps 3-5 gone?); then GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/s11f; mkdir -p $R
pack() { pkill -f run_grpo.py; sleep 1; cp $0 $R/ 2>/dev/null; tar czf $OUT/s11_f.tgz -C /tmp s11f; }
trap pack EXIT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
STEPS=5 COPY_TO=$R/r EXTRA="policy.generation.stop_token_ids=[]" timeout 200 bash benchmarks/gpu_cli_run.sh /tmp/g17 build fp8_kv > $R/run.log 2>&1
echo "cli rc $? at $(el) s"
python3 /dev/stdin <<'PY'
import json
for l in open("/tmp/s11f/r/fp8_kv/metrics.jsonl"):
    r = json.loads(l)
    if "timing/total_step_time" in r:
        print(r["step"], *(f"{k.split('/')[-1]} {r['timing/' + k]:.2f}" for k in ("total_step_time", "generation", "generation/prefill", "generation/decode", "logprobs", "training")), f"tmpe {r['train/token_mult_prob_error']:.4f}")
PY
timeout $(( 330 - $(el) )) python3 -m pytest -q -p no:cacheprovider -n 0 tests/gpu/test_sdpa_backends_gpu.py tests/gpu/test_generation_gpu.py tests/gpu/test_cuda_graph_decode.py > $R/gpu_tests.log 2>&1
echo "gpu tests rc $? at $(el) s"; tail -5 $R/gpu_tests.log
