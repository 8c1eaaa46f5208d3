#!/usr/bin/env bash
# The wheels the CLI needs on the GPU box that its image lacks (docs/gpu_cli_run.md), at uv.lock's versions, for
# CPython 3.12 on x86-64, into .whl/ (ignored by git through .git/info/exclude). Run from the repo root on a machine
# with pip and internet; then carry ".whl" in the device call and start its command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
PACKAGES=(pydantic pydantic-core annotated-types typing-inspection omegaconf antlr4-python3-runtime hydra-core
          math-verify latex2sympy2-extended)
PYTHON=${PYTHON:-python3}
DEST=${DEST:-.whl}
mkdir -p "$DEST" .git/info
grep -qxF "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
pins=$("$PYTHON" - "${PACKAGES[@]}" <<'PY'
import sys, tomllib
lock = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
missing = [n for n in sys.argv[1:] if n not in lock]
if missing:
    sys.exit(f"gpu_wheels: not in uv.lock: {', '.join(missing)}")
print(" ".join(f"{n}=={lock[n]}" for n in sys.argv[1:]))
PY
)
wheels=() sdists=()
for pin in $pins; do
  case $pin in antlr4-python3-runtime==*) sdists+=("$pin") ;; *) wheels+=("$pin") ;; esac  # no wheel on PyPI
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${wheels[@]}"
"$PYTHON" -m pip wheel -q --no-deps -w "$DEST" "${sdists[@]}"  # pure Python: built here, runs there
ls "$DEST"
