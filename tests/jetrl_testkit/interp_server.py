"""A fork server for the Triton-interpreter child runs (`run_interpreted`, tests/conftest.py).

TRITON_INTERPRET is read when a kernel is defined, so those checks run in a child process started with it set. A fresh
`python -c SOURCE` per check paid torch + triton + nemo_jetrl's imports each time (~5 CPU-s on the 2-core CI machine,
14 checks). This server starts once per pytest process with TRITON_INTERPRET=1, imports those modules, and forks one
child per request: the child runs SOURCE as `python -c SOURCE` would (`__main__`, argv ["-c"], its own stdout and
stderr), so each check still runs in a process of its own whose state no other check sees.

Protocol (one JSON object per line): request {"source": str, "timeout": float} on stdin; reply {"rc": int,
"stdout": str, "stderr": str} on stdout (rc -9: killed at the timeout). Forking is safe because the server only
imports: no OpenMP pool or other thread runs yet (asserted).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback

# what the interpreted checks import (modules defining Triton kernels among them: defined here in interpreter mode)
PRELOAD = (
    "torch",
    "triton",
    "numpy",
    "nemo_jetrl.models.decoder",
    "nemo_jetrl.models.tiny",
    "nemo_jetrl.precision",
    "nemo_jetrl.generation.native.engine",
)


def _child(source: str, out_fd: int, err_fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.argv = ["-c"]
    sys.path[0] = ""  # `python -c`: the working directory first, not this file's folder
    code = 0
    try:
        exec(compile(source, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(source: str, timeout: float) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(source, out.fileno(), err.fileno())
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = -signal.SIGKILL
                break
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        return {"rc": rc, "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "start the server with TRITON_INTERPRET=1"
    for name in PRELOAD:
        importlib.import_module(name)
    assert threading.active_count() == 1, f"threads before fork: {threading.enumerate()}"
    replies = sys.stdout
    print("ready", file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(_run(request["source"], request["timeout"])), file=replies, flush=True)


if __name__ == "__main__":
    main()
