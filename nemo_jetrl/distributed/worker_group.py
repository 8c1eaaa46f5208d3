"""Ray worker group: one colocated trainer + rollout actor per GPU (or per CPU worker), one placement group.

Every call names a *phase*. A worker that raises or dies surfaces as ONE `WorkerGroupError` naming the worker and
the phase; the group then kills every actor at once (the others may be blocked in a collective waiting for it) so
the driver can stop cleanly.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from nemo_jetrl.distributed.cluster import RAY_ENV_DEFAULTS, ClusterSpec, ray_init_kwargs
from nemo_jetrl.distributed.errors import WorkerGroupError
from nemo_jetrl.distributed.worker import PolicyWorker

# Ray reads RAY_ENABLE_UV_RUN_RUNTIME_ENV when it is imported: set the defaults first.
for _key, _value in RAY_ENV_DEFAULTS.items():
    os.environ.setdefault(_key, _value)

import ray  # noqa: E402
from ray._private import ray_constants  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

PLACEMENT_TIMEOUT_S = 300.0
DIST_TIMEOUT_S = 1800.0


def ensure_ray(spec: ClusterSpec) -> bool:
    """Start (or join) Ray with the project's env defaults; True when this call started it."""
    if ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV:
        warnings.warn(
            "Ray was imported before nemo_jetrl.distributed could set RAY_ENABLE_UV_RUN_RUNTIME_ENV=0: under `uv run` "
            "its workers will try to rebuild the environment. Export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0.",
            stacklevel=2,
        )
    if ray.is_initialized():
        return False
    ray.init(**ray_init_kwargs(spec))
    return True


def _cause(exc: BaseException) -> str:
    """One line: the remote exception's type and message (not Ray's whole remote traceback)."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and cause is not None:
        exc = cause
    if isinstance(exc, ray.exceptions.ActorDiedError | ray.exceptions.ActorUnavailableError):
        return f"the worker process died ({type(exc).__name__})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _release(actors: list, pg: Any, owns_ray: bool) -> None:
    """Kill the actors, free the placement group, stop the Ray this group started (idempotent, never raises)."""
    if not ray.is_initialized():  # Ray already stopped: it took the actors with it (any Ray call would reconnect)
        return
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: S110 - already gone (or Ray already stopped at interpreter exit)
            pass
    try:
        remove_placement_group(pg)
    except Exception:  # noqa: S110
        pass
    if owns_ray and ray.is_initialized():
        ray.shutdown()


class RayWorkerGroup:
    """`spec.num_workers` `PolicyWorker` actors forming one torch.distributed group (gloo on CPU, NCCL on GPU).

    Released by `shutdown()`, on the first worker failure, or when the group is garbage-collected. `env_vars`: the
    workers' environment (`policy.dtensor_cfg.env_vars`, set before each actor's process starts: Ray's runtime_env).
    """

    def __init__(self, spec: ClusterSpec, env_vars: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        owns_ray = ensure_ray(spec)
        self.actors: list[Any] = []
        self.infos: list[dict[str, Any]] = [{} for _ in range(spec.num_workers)]
        bundle = spec.worker_resources()
        total = ray.cluster_resources()
        short = {k: (v * spec.num_workers, total.get(k, 0)) for k, v in bundle.items()}
        short = {k: n for k, n in short.items() if n[1] < n[0]}
        if short:
            if owns_ray:
                ray.shutdown()
            need = ", ".join(f"{k}: need {a:g}, cluster has {b:g}" for k, (a, b) in short.items())
            raise RuntimeError(
                f"the Ray cluster is too small for {spec.num_workers} workers of {bundle} ({need}); check "
                "cluster.num_nodes / gpus_per_node / cpu_workers_per_node, and that Slurm gave the job the whole "
                "node (sbatch --exclusive)"
            )
        pg = placement_group([dict(bundle) for _ in range(spec.num_workers)], strategy="PACK")
        self._release = weakref.finalize(self, _release, self.actors, pg, owns_ray)
        self._release.atexit = False  # at interpreter exit Ray's own shutdown stops the actors
        try:
            ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            message = (
                f"Ray could not place {spec.num_workers} workers of {bundle} within {PLACEMENT_TIMEOUT_S:.0f}s "
                f"(available: {ray.available_resources()}); check cluster.num_nodes / gpus_per_node / "
                "cpu_workers_per_node"
            )
            self._release()
            raise RuntimeError(message) from None
        remote_cls = ray.remote(PolicyWorker)
        for rank in range(spec.num_workers):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank)
            self.actors.append(
                remote_cls.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=strategy,
                    max_restarts=0,
                    max_task_retries=0,
                    **({"runtime_env": {"env_vars": dict(env_vars)}} if env_vars else {}),
                ).remote(rank, spec.num_workers, use_gpu=spec.uses_gpus, num_cpu_threads=spec.num_cpu_threads)
            )
        self.infos = self.run("start", "info")
        addr, port = self.run("rendezvous", "rendezvous_address", ranks=[0])[0]
        self.run("init_distributed", "init_distributed", common=(addr, port, spec.torch_backend, DIST_TIMEOUT_S))

    @property
    def num_workers(self) -> int:
        return len(self.actors)

    def run(
        self,
        phase: str,
        method: str,
        *,
        per_worker: Sequence[tuple] | None = None,
        common: tuple = (),
        ranks: Sequence[int] | None = None,
    ) -> list[Any]:
        """Call `method(*per_worker[i], *common)` on workers `ranks` (default all); results in rank order."""
        if not self.actors:
            raise RuntimeError(f"worker group is shut down (phase '{phase}')")
        ranks = list(range(self.num_workers)) if ranks is None else list(ranks)
        if per_worker is not None and len(per_worker) != len(ranks):
            raise ValueError(f"phase '{phase}': {len(per_worker)} argument tuples for {len(ranks)} workers")
        futures = []
        for j, rank in enumerate(ranks):
            args = (*(per_worker[j] if per_worker is not None else ()), *common)
            futures.append(getattr(self.actors[rank], method).remote(*args))
        return self._wait(phase, ranks, futures)

    def _wait(self, phase: str, ranks: list[int], futures: list) -> list[Any]:
        position = {f: j for j, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            j = position[done[0]]
            try:
                results[j] = ray.get(done[0])
            except Exception as exc:  # the first failure wins; the others may be stuck in a collective
                rank = ranks[j]
                info = self.infos[rank] if rank < len(self.infos) else {}
                self.shutdown(graceful=False)
                raise WorkerGroupError(rank, phase, _cause(exc), node=info.get("node"), pid=info.get("pid")) from None
        return results

    def put(self, value: Any) -> Any:
        """Store `value` once in the object store (pass the ref to many workers instead of W copies)."""
        return ray.put(value)

    def shutdown(self, graceful: bool = True) -> None:
        """Stop the actors (gracefully: destroy the process group first), free the placement group."""
        if graceful and self.actors:
            try:
                ray.get([a.shutdown.remote() for a in self.actors], timeout=30)
            except Exception:  # noqa: S110 - best effort, the actors are killed next
                pass
        self._release()
        self.actors = []

    def describe(self) -> Mapping[str, Any]:
        return {"num_workers": self.num_workers, "backend": self.spec.torch_backend, "workers": self.infos}
