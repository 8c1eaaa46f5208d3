"""A hard time limit for answer verification: the work runs in a child process that is killed when it overruns.

math-verify evaluates a response's answer with sympy, and a response can ask for work that never ends:
`\\boxed{10^{10^{10}}!}` makes sympy raise 10 to the 10^10 and take its factorial. An in-process SIGALRM timer
(`time_limit`) should stop that, and once did not: a CI run sat in sympy's power for over 17 minutes under a 0.3 s
timer (why was not found; CPython's power checks signals). So the verification runs in a child process (one per
process, shared, started on first use, `spawn` so it inherits neither threads nor CUDA): the child runs each call
under its own `time_limit` (Python-level overruns end there and the child lives on, caches warm); the parent waits
`seconds + GRACE_S` for the answer and otherwise kills the child, reports a timeout, and starts a new child for the
next call. It works from any thread (the in-process timer works on the main thread only). Torch-free: the child
imports this module and the called function's, nothing else of the trainer.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

GRACE_S = 1.0  # past the child's own timer before the parent kills it
START_TIMEOUT_S = 120.0  # a fresh interpreter importing math-verify and sympy


class VerifierStartError(RuntimeError):
    """The verifier process could not be started (e.g. from a daemonic process, which may not have children)."""


class VerificationTimeout(BaseException):
    """Raised when a verification overruns its limit; a BaseException so math-verify's and sympy's `except
    Exception` cannot swallow it inside the timer."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise VerificationTimeout in the block after `seconds` (no limit when None or off the main thread). Not a hard
    limit: the handler runs only between Python bytecodes, and code that catches it stops it (VerifierProcess is the
    hard limit)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise VerificationTimeout(f"verification exceeded {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _serve(conn: Any, warmup: tuple | None) -> None:
    """The child's loop: `warmup` = (fn, args) run once, without a limit, before "ready" (imports and caches that
    would otherwise count against the first job's limit); then `(fn, [args, ...], seconds)` in; per item, in order,
    `("ok", result)`, `("timeout", why)` or `("error", exc)` out; None or a closed pipe ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops the child
    if warmup is not None:
        warmup[0](*warmup[1])
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        fn, jobs, seconds = message
        for args in jobs:
            try:
                with time_limit(seconds):
                    reply: tuple[str, Any] = ("ok", fn(*args))
            except VerificationTimeout as exc:
                reply = ("timeout", str(exc))
            except Exception as exc:  # the caller's to see, as raised in-process
                reply = ("error", exc)
            try:
                conn.send(reply)
            except Exception as exc:  # an unpicklable result or exception
                conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc} (sending {reply[0]})")))


def verdict_of(outcome: tuple[str, Any]) -> Any:
    """A run_many outcome's value; raises VerificationTimeout for a timeout and the exception for an error."""
    kind, value = outcome
    if kind == "timeout":
        raise VerificationTimeout(value)
    if kind == "error":
        raise value
    return value


class VerifierProcess:
    """Runs module-level functions in a child process under a hard time limit (module docstring)."""

    def __init__(self, warmup: tuple | None = None, context: str = "spawn") -> None:
        self._warmup = warmup  # (fn, args) each new child runs before its first job (_serve)
        self._ctx = mp.get_context(context)
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self.kills = 0  # children killed for overrunning

    @property
    def pid(self) -> int | None:
        """The child's process id; None before the first call and after a kill."""
        return None if self._proc is None else self._proc.pid

    def run(self, fn: Callable[..., Any], args: tuple, seconds: float) -> Any:
        """`fn(*args)` in the child; raises VerificationTimeout after `seconds` (+ GRACE_S where the child's timer
        cannot stop it: the child is killed), and what `fn` raised."""
        return verdict_of(self.run_many(fn, [args], seconds)[0])

    def run_many(self, fn: Callable[..., Any], jobs: list[tuple], seconds: float) -> list[tuple[str, Any]]:
        """`fn(*args)` for each job, in order, each under its own limit, sent in one message: the child answers job
        by job; a job overrunning past the grace kills the child and the jobs after it go to a new one. Per job
        `("ok", value)`, `("timeout", why)` (also where the child died) or `("error", exception)`."""
        outcomes: list[tuple[str, Any]] = []
        with self._lock:
            while len(outcomes) < len(jobs):
                if self._proc is None or not self._proc.is_alive():
                    self._start()
                rest = jobs[len(outcomes) :]
                self._conn.send((fn, rest, seconds))
                for _ in rest:
                    if not self._conn.poll(seconds + GRACE_S):
                        self._kill()
                        self.kills += 1
                        outcomes.append(("timeout", f"verification exceeded {seconds} s; its process was killed"))
                        break
                    try:
                        outcomes.append(self._conn.recv())
                    except EOFError:  # killed under us (e.g. by the kernel for memory): the job did not finish
                        self._kill()
                        outcomes.append(("timeout", "the verifier process died during a verification"))
                        break
        return outcomes

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.is_alive():
                with contextlib.suppress(OSError):
                    self._conn.send(None)
                self._proc.join(timeout=2.0)
            self._kill()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self._warmup), daemon=True, name="jetrl-verifier")
        try:
            proc.start()
        except (AssertionError, OSError) as err:  # multiprocessing asserts a daemonic parent has no children
            raise VerifierStartError(f"the verifier process could not start ({err or type(err).__name__})") from err
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            proc.kill()
            raise VerifierStartError(f"the verifier process did not start within {START_TIMEOUT_S:.0f} s")
        try:
            parent.recv()
        except EOFError:  # it exited first: its warm-up raised (the traceback is on stderr) or it was killed
            proc.join(timeout=5.0)
            why = f"the verifier process exited before it was ready (exit code {proc.exitcode})"
            raise VerifierStartError(why) from None
        self._proc, self._conn = proc, parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5.0)
            self._conn.close()
        self._proc = self._conn = None


_SHARED: VerifierProcess | None = None
_SHARED_LOCK = threading.Lock()


def shared_verifier(warmup: tuple | None = None) -> VerifierProcess:
    """This process's verifier (one child for every MathEnvironment here), made on first use with `warmup`."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = VerifierProcess(warmup)
        return _SHARED
