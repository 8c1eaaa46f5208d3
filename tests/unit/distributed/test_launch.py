"""`cluster.backend: torchrun`: detection from torchrun's environment, its refusals, what several ranks refuse
(one function), how a plan cuts a pass and the start-up line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.cluster_config import ClusterConfig, multi_rank_problems
from nemo_jetrl.distributed.launch import MULTICAST_OFF, startup_line, torchrun_env
from nemo_jetrl.policy.parallel.plan import ParallelPlan
from nemo_jetrl.schema import validate_config

BASE = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"
RANK1_OF_2 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}


@pytest.fixture
def torchrun(monkeypatch):
    for key, value in RANK1_OF_2.items():
        monkeypatch.setenv(key, value)


def test_torchrun_env_needs_all_three_variables():
    assert torchrun_env({}) is None
    assert torchrun_env({"RANK": "0", "WORLD_SIZE": "2"}) is None  # no LOCAL_RANK: not torchrun's
    assert torchrun_env(RANK1_OF_2) == {"rank": 1, "world_size": 2, "local_rank": 1}


def test_null_backend_is_torchrun_under_torchrun(torchrun):
    cfg = validate_config(load_config(BASE))
    spec = ClusterSpec.from_config(cfg.cluster)
    assert (spec.backend, spec.num_workers, spec.num_dp_groups, spec.num_seed_shards) == ("torchrun", 2, 2, 2)
    tp2 = ClusterSpec.from_config(cfg.cluster, tensor_parallel_size=2)
    assert (tp2.num_dp_groups, tp2.num_seed_shards) == (1, 1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.backend=local"], r"cluster.backend: 'local' under torchrun \(WORLD_SIZE=2\) would run one"),
        (["cluster.backend=ray"], r"cluster.backend: 'ray' under torchrun"),
        (["cluster.gpus_per_node=4"], r"\(1 \* 4\) != torchrun's WORLD_SIZE 2: set cluster.gpus_per_node: 0"),
        (["policy.dtensor_cfg.tensor_parallel_size=4"], r"must divide torchrun's ranks \(WORLD_SIZE = 2\)"),
    ],
)
def test_torchrun_refusals_name_the_key(torchrun, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(BASE, overrides))


def test_torchrun_outside_torchrun_is_refused(monkeypatch):
    for key in RANK1_OF_2:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match=r"cluster.backend: torchrun needs torchrun's environment \(RANK, WORLD_SIZE"):
        validate_config(load_config(BASE, ["cluster.backend=torchrun"]))


def test_what_several_ranks_refuse_and_one_rank_runs():
    policy = validate_config(load_config(BASE)).policy
    two = ClusterSpec.from_config(ClusterConfig(backend="ray", cpu_workers_per_node=2))
    one = ClusterSpec.from_config(ClusterConfig())
    assert multi_rank_problems(policy, two) == multi_rank_problems(policy, one) == []  # matched kernels etc. run
    graphs = policy.model_copy(update={"train_cuda_graphs": True})
    vllm, exact = policy.model_copy(deep=True), policy.model_copy(deep=True)
    vllm.generation.backend, exact.generation.deterministic = "vllm", True
    assert multi_rank_problems(graphs, one) == multi_rank_problems(vllm, one) == []
    (graphs_line,) = multi_rank_problems(graphs, two)
    assert graphs_line.startswith("policy.train_cuda_graphs: true is not supported with cluster.backend: ray with 2")
    assert "collectives" in graphs_line and graphs_line.endswith("set it false")
    assert multi_rank_problems(vllm, two)[0].startswith("policy.generation.backend: vllm is not supported")
    assert multi_rank_problems(exact, two)[0].startswith("policy.generation.deterministic: true needs one process")
    sharded_rollout = ClusterSpec.from_config(ClusterConfig(rollout_seed_shards=2))
    assert len(multi_rank_problems(exact, sharded_rollout)) == 1  # one process, but two rollout batches


def test_an_moe_model_is_refused_on_several_ranks_and_runs_in_one(tmp_path, monkeypatch):
    policy = validate_config(load_config(BASE)).policy
    moe = tmp_path / "moe"
    moe.mkdir()
    (moe / "config.json").write_text('{"model_type": "qwen3_moe"}')  # all the check reads
    policy.model_name = str(moe)
    one = ClusterSpec.from_config(ClusterConfig())
    assert multi_rank_problems(policy, one) == []
    for key, value in RANK1_OF_2.items():
        monkeypatch.setenv(key, value)
    two = ClusterSpec.from_config(ClusterConfig(backend="torchrun"))
    (line,) = multi_rank_problems(policy, two)
    assert line.startswith("cluster.backend: torchrun does not train MoE models yet (2 rank(s)")
    assert multi_rank_problems(policy.model_copy(update={"model_name": "tiny-arith"}), two) == []  # a dense model on the same ranks


def test_a_plan_cuts_a_pass_as_one_process_does():
    single = ParallelPlan.single()
    assert single.share(list("abcde")) == (list("abcde"), 5) and single.gather([1, 2]) == [1, 2]
    assert single.first_of("x") == "x" and single.first_of(None) is None
    # rank 3 of 4 ranks in 2 data-parallel groups of 2 TP ranks: group 1's block, as many forwards as group 0
    tp = ParallelPlan("fsdp_tp", world_size=4, rank=3, tp=2)
    assert (tp.dp_rank, tp.tp_rank, tp.num_dp_groups, tp.is_main) == (1, 1, 2, False)
    assert tp.share(list("abcde")) == (list("de"), 3)
    dp = ParallelPlan("fsdp", world_size=4, rank=3)
    assert dp.share(list("abc")) == ([], 1)  # more groups than pieces: a dummy forward only


def test_the_startup_line_says_how_the_run_is_spread(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", MULTICAST_OFF["NCCL_NVLS_ENABLE"])
    line = startup_line(4, 2, torch.device("cuda", 0))
    assert line.startswith("cluster: torchrun, 4 rank(s) (2 data-parallel x 2 tensor-parallel) on cuda, nccl")
    assert "NCCL_NVLS_ENABLE=0" in line
    assert startup_line(2, 1, torch.device("cpu")).startswith("cluster: torchrun, 2 rank(s) (2 data-parallel) on cpu")
