set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
timeout 60 python3 .gpu/mma_bits_probe.py 2>&1 | tail -8
timeout 420 python3 .gpu/exact_cuda_check.py 4,3 3,4 2,4 2>&1 | grep -v "^\s*$" | tail -60
