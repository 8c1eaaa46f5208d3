"""`cluster.*`: spec derived from the config, worker counts, validation errors naming keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.distributed.cluster import ClusterSpec, ray_init_kwargs
from nemo_jetrl.distributed.cluster_config import ClusterConfig
from nemo_jetrl.policy.parallel.fsdp import tile_aligned_placement
from nemo_jetrl.schema import validate_config

BASE = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_base.yaml"


def _cluster(*overrides: str) -> ClusterConfig:
    return validate_config(load_config(BASE, list(overrides))).cluster


def _spec(**fields) -> ClusterSpec:
    return ClusterSpec.from_config(ClusterConfig(**fields))


def test_base_config_is_local_single_process():
    spec = ClusterSpec.from_config(_cluster())
    assert (spec.backend, spec.num_workers, spec.num_seed_shards, spec.torch_backend) == ("local", 1, 1, "gloo")


def test_ray_worker_counts_and_seed_shards():
    cpu = ClusterSpec.from_config(
        _cluster("cluster.backend=ray", "cluster.cpu_workers_per_node=3", "cluster.num_nodes=2")
    )
    assert (cpu.num_workers, cpu.num_seed_shards, cpu.torch_backend, cpu.uses_gpus) == (6, 6, "gloo", False)
    assert cpu.worker_resources() == {"CPU": 1.0}
    gpu = ClusterSpec.from_config(
        _cluster(
            "cluster.backend=ray", "cluster.gpus_per_node=8", "cluster.num_nodes=2", "cluster.rollout_seed_shards=4"
        )
    )
    assert (gpu.num_workers, gpu.num_seed_shards, gpu.torch_backend) == (16, 4, "nccl")
    assert gpu.worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    local = ClusterSpec.from_config(_cluster("cluster.rollout_seed_shards=2"))
    assert (local.num_workers, local.num_seed_shards) == (1, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.backend=local", "cluster.num_nodes=2"], r"cluster.backend: 'local' is one process on one device"),
        (["cluster.backend=local", "cluster.gpus_per_node=8"], r"cluster.gpus_per_node \(8\) asks for 8 devices"),
        (["cluster.backend=ray", "cluster.gpus_per_node=2", "cluster.device=cpu"], "cluster.device: 'cpu' contradicts"),
        (["cluster.backend=ray", "cluster.device=cuda"], "cluster.device: 'cuda' with cluster.backend: ray"),
        (["cluster.backend=slurm"], "cluster.backend"),
        (["cluster.rollout_seed_shards=0"], "cluster.rollout_seed_shards"),
    ],
)
def test_bad_cluster_config_names_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _cluster(*overrides)


def test_spec_takes_every_field_of_the_section():
    # ClusterSpec holds exactly the validated section, none left out, plus policy.dtensor_cfg.tensor_parallel_size
    section = ClusterConfig(gpus_per_node=2, num_cpu_threads=3, ray_address="auto", rollout_seed_shards=5)
    spec = ClusterSpec.from_config(section)
    assert spec.backend == "ray"  # resolved by the section from the device count
    assert dataclasses.asdict(spec) == {**section.model_dump(), "tensor_parallel_size": 1}
    with pytest.raises(TypeError, match="ClusterSpec.from_config expects the validated config section ClusterConfig"):
        ClusterSpec.from_config(section.model_dump())
    tp2 = ClusterSpec.from_config(section, tensor_parallel_size=2)
    assert (tp2.num_workers, tp2.num_dp_groups, tp2.num_seed_shards) == (2, 1, 5)  # explicit seed shards win


def test_ray_init_joins_an_address_or_starts_locally(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local = ray_init_kwargs(_spec(backend="ray", cpu_workers_per_node=2))
    assert "address" not in local and local["num_cpus"] >= 2 and local["include_dashboard"] is False
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert ray_init_kwargs(_spec(backend="ray"))["address"] == "10.0.0.1:6379"
    assert ray_init_kwargs(_spec(backend="ray", ray_address="auto"))["address"] == "auto"


def test_tile_aligned_placement_prefers_whole_tiles():
    import torch

    assert tile_aligned_placement(torch.empty(768, 256), 2).dim == 0  # 384 rows per rank = 3 tiles
    assert tile_aligned_placement(torch.empty(128, 256), 2).dim == 1  # 64 rows would split a tile; 128 cols do not
    assert tile_aligned_placement(torch.empty(128, 128), 2).dim == 0  # neither: Shard(0), refit falls back
    assert tile_aligned_placement(torch.empty(256), 2).dim == 0
