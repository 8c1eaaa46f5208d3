"""The example scripts' `main(argv)` run in this process as `python script.py *argv` runs it, and the script itself
in a fresh interpreter: (exit status, stdout, stderr) from either.

A fresh interpreter costs ~7 CPU-s (torch + the config schema's imports) on the 2-core CI machine, and the CLI tests
had ~25 of them: each CLI test module checks its cases in-process and runs one case as a process too, asserting the
two give the same triple (the entry point `sys.exit(main())`, import-time output and the exit status stay covered).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
# the warning filters of a fresh interpreter (no -W, no PYTHONWARNINGS): other warnings print to stderr
_SILENT_IN_A_FRESH_PROCESS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def load_script(path: Path, name: str) -> ModuleType:
    """The script as a module (its `if __name__ == "__main__"` block does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(main: Callable[[list[str]], int], argv: Sequence[str]) -> tuple[int, str, str]:
    """`main(argv)` with stdout / stderr captured: (status, stdout, stderr); argparse's SystemExit gives its code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.resetwarnings()
        for category in _SILENT_IN_A_FRESH_PROCESS:
            warnings.simplefilter("ignore", category)
        try:
            status = main(list(argv))
        except SystemExit as exc:  # as the interpreter maps it: None -> 0, int -> itself, anything else printed -> 1
            status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
    return status, out.getvalue(), err.getvalue()


def run_script(path: Path, argv: Sequence[str], timeout: float = 300) -> tuple[int, str, str]:
    """`python path *argv` from the repository root, offline: (status, stdout, stderr)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(path), *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout, proc.stderr
