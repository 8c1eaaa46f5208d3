"""The one error a failing worker group raises (Ray-free, so callers can catch it without importing Ray)."""

from __future__ import annotations


class WorkerGroupError(RuntimeError):
    """A worker died or raised during a phase; the whole group has been stopped.

    Attributes: `worker` (rank), `phase` (e.g. "train"), `node` / `pid` when known, `cause` (one line).
    """

    def __init__(self, worker: int, phase: str, cause: str, *, node: str | None = None, pid: int | None = None):
        self.worker, self.phase, self.cause, self.node, self.pid = worker, phase, cause, node, pid
        where = ", ".join(x for x in (f"node {node}" if node else "", f"pid {pid}" if pid else "") if x)
        super().__init__(
            f"worker {worker}{f' ({where})' if where else ''} failed during phase '{phase}': {cause} "
            "-- the worker group was stopped"
        )
