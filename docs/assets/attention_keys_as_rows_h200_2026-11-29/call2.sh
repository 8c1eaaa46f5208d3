#!/bin/bash
# call 2: GPU tests of the exact paths on the swapped-orientation kernel; the shipped 1.7B FP8+KV recipe through the
# CLI, matched_kernels=auto and fast, 5 steps each (matched, fast, matched again if time is left)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/res2; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
pack() { tar czf $OUT/res2.tgz -C /tmp res2; }
trap pack EXIT
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/unit/models/test_batch_invariant_compiled.py tests/gpu/test_batch_invariant_gpu.py tests/gpu/test_paged_exact_gpu.py tests/gpu/test_matched_packing_gpu.py > $R/tests.log 2>&1; echo "tests rc=$? at $(el) s"; tail -4 $R/tests.log
bash benchmarks/gpu_cli_run.sh /tmp/g build > $R/build.log 2>&1; echo "build rc=$? at $(el) s"
run() {  # V SUFFIX
  STEPS=5 SUFFIX=$2 timeout $(( 590 - $(el) )) bash benchmarks/gpu_cli_run.sh /tmp/g $1 > $R/$1$2.log 2>&1; echo "$1$2 rc=$? at $(el) s"
  d=/tmp/g/logs/$1$2; mkdir -p $R/$1$2; cp $d/{metrics.jsonl,config.yaml,gpu_memory.csv} $R/$1$2/ 2>/dev/null
}
run fp8_kv_matched ""
run fp8_kv ""
[ $(el) -lt 480 ] && run fp8_kv_matched _2
python3 -m benchmarks.gpu_cli_report --baseline fp8_kv fp8_kv=$R/fp8_kv matched=$R/fp8_kv_matched matched2=$R/fp8_kv_matched_2 2>&1 | tail -40
