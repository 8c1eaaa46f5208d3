"""Ray fixtures of the functional tests: one local 2-CPU Ray per test module that asks for it (its start is the slow
part), and placement groups freed after each test. Test modules set `RAY_ENABLE_UV_RUN_RUNTIME_ENV=0` before their
`pytest.importorskip("ray")` (Ray reads it at import; DESIGN.md §5)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_module(ray_lock):
    """One local Ray for the module (one such module at a time under pytest-xdist: `ray_lock`)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def ray_cluster(ray_module):
    """After each test, free what a failed test may have left: removing a placement group kills its actors."""
    yield
    import ray
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    for pg_id, info in placement_group_table().items():
        if info["state"] != "REMOVED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
