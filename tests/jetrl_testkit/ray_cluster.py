"""Ray fixtures for the functional tests: one local 2-CPU Ray per test module, freed placement groups after each test.

Import the fixtures into a test module (`from jetrl_testkit.ray_cluster import ray_cluster, ray_module`) after its
`pytest.importorskip("ray")`, which must follow `os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")`
(Ray reads it at import; DESIGN.md §5).
"""

from __future__ import annotations

import sys

import pytest
import ray


@pytest.fixture(scope="module")
def ray_module():
    """One local Ray for the module (its start is the slow part)."""
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def ray_cluster(ray_module):
    """After each test, free what a failed test may have left: removing a placement group kills its actors."""
    yield
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    for pg_id, info in placement_group_table().items():
        if info["state"] != "REMOVED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))


def on_worker(actor, fn, *args):
    """`fn(worker, *args)` run inside a `PolicyWorker` actor (Ray's `__ray_call__`); its result. `fn`'s module
    (a test module the workers cannot import) travels by value."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[fn.__module__])
    return ray.get(actor.__ray_call__.remote(fn, *args), timeout=120)
