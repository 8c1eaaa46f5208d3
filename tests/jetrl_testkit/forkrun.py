"""A torchrun stand-in for the CPU rank scripts (tests/unit/distributed/*_rank_check.py): one interpreter imports the
heavy modules once, then forks NPROC ranks that each run SCRIPT as `__main__` with torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); gloo's env:// rendezvous sees what it sees under
torchrun. The ranks are still separate processes; what they share is the import (torch + transformers + nemo_jetrl:
~10 CPU-s per rank on the 2-core CI machine, most of what a torchrun launch of these tiny checks cost).

    python forkrun.py [--preload MOD[,MOD...]] JOBS_JSON   # [{"nproc": N, "script": PATH, "args": [...]}, ...]
    run_ranks(SCRIPT, NPROC, *ARGS)  # from a test: one launch, output captured
    run_launches([(SCRIPT, NPROC, ARGS), ...])  # several, one after another, from one launcher

Each launch gets a free port and runs to the end before the next forks. Exits 0 when every rank of every launch exits
0; the first rank to fail stops the others (they would wait in a collective) and the launcher exits 1 at once.
Forking is safe here because the parent only imports: no OpenMP pool or other thread runs yet (asserted).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence

# what every rank script imports (torch, transformers, the trainer, the rollout engine) before its own imports
PRELOAD = ("nemo_jetrl.algorithms.grpo",)


def run_launches(
    launches: Sequence[tuple[os.PathLike | str, int, Sequence[str]]], timeout: float = 400
) -> subprocess.CompletedProcess:
    """Run each (script, nproc, args) on `nproc` CPU ranks, in order (this launcher in a child process; stdout /
    stderr captured)."""
    jobs = [{"script": str(script), "nproc": nproc, "args": [str(a) for a in args]} for script, nproc, args in launches]
    cmd = [sys.executable, __file__, f"--preload={','.join(PRELOAD)}", json.dumps(jobs)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def run_ranks(script: os.PathLike | str, nproc: int, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """Run `script` on `nproc` CPU ranks (one launch of `run_launches`)."""
    return run_launches([(script, nproc, args)], timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_the_launcher() -> None:
    """A rank whose launcher is killed (the test's timeout) is killed too, as torchrun's ranks are (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _rank(rank: int, nproc: int, port: int, script: str, args: list[str]) -> int:
    _die_with_the_launcher()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _launch(nproc: int, script: str, args: list[str]) -> int:
    """Fork the `nproc` ranks of one launch and wait for them: 0, or 1 after stopping the others on a failure."""
    assert threading.active_count() == 1, f"threads before fork: {threading.enumerate()}"
    port = _free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    children = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            code = _rank(rank, nproc, port, script, args)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        children[pid] = rank
    status = 0
    while children:
        pid, wait_status = os.wait()
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(wait_status)
        if code != 0 and status == 0:
            print(f"forkrun: {script} rank {rank} exited with {code}; stopping the others", file=sys.stderr)
            status = 1
            for other in children:
                os.kill(other, signal.SIGKILL)
    return status


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preload", default="", help="modules to import before forking (comma-separated)")
    parser.add_argument("jobs", help='JSON: [{"nproc": N, "script": PATH, "args": [...]}, ...]')
    opts = parser.parse_args()
    jobs = json.loads(opts.jobs)
    for name in filter(None, opts.preload.split(",")):
        importlib.import_module(name)
    for job in jobs:  # the scripts' own imports (not their main)
        sys.path.insert(0, os.path.dirname(os.path.abspath(job["script"])))
        runpy.run_path(job["script"], run_name="__forkrun_preload__")
        sys.path.pop(0)
    for job in jobs:
        if _launch(job["nproc"], job["script"], job["args"]) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
