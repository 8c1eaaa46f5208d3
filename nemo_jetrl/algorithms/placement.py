"""Where a GRPO run's trainer and rollout engine live (`cluster.backend`), the same `NativePolicy` everywhere:

- local: one process, one device;
- torchrun: this process is one rank of the run; the driver runs SPMD on every rank (rank 0 logs, prints and
  writes checkpoints, the others stay silent), each rank holding its trainer shard and a colocated engine;
- ray: the driver stays on the CPU and fans every call out to a Ray worker group whose workers are built as
  torchrun ranks are (`distributed/ray_policy.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed

from nemo_jetrl.algorithms.run_config import RunConfig
from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.cluster_config import multi_rank_problems
from nemo_jetrl.distributed.launch import init_torchrun, startup_line
from nemo_jetrl.generation.build import build_local_engine
from nemo_jetrl.generation.interfaces import GenerationInterface
from nemo_jetrl.policy.auto_switches import announce, worker_switch_lines
from nemo_jetrl.policy.interfaces import PolicyInterface
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.policy.parallel.plan import ParallelPlan
from nemo_jetrl.policy.trainer_setup import resolve_device
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.utils.cpu_runtime import configure_cpu_process


@dataclass
class Placement:
    policy: PolicyInterface
    engine: GenerationInterface
    device: torch.device  # the driver's (Ray: the CPU)
    is_main: bool  # this process logs, prints and writes checkpoints
    startup: str | None = None  # a line saying how the run is spread (rank 0 prints it)


def place(cfg: RunConfig, *, init_reference_model: bool) -> Placement:
    """The policy and engine of this process for the validated config; refusals by name."""
    cluster, policy_cfg = cfg.cluster, cfg.policy
    tp = policy_cfg.dtensor_cfg.tensor_parallel_size
    spec = ClusterSpec.from_config(cluster, tp)
    problems = multi_rank_problems(policy_cfg, spec)
    if problems:
        raise ValueError("; ".join(problems))
    # several ranks: no captured micro-batches (`auto` is off: one line); the matched kernels' `auto` is the ranks'
    # self-check on every backend (rank 0's line)
    switch_lines = worker_switch_lines(policy_cfg, spec.backend) if spec.num_workers > 1 else []
    if spec.backend == "ray":  # one FSDP2 trainer shard + rollout engine per worker (docs/cluster.md)
        from nemo_jetrl.distributed.ray_policy import build_ray_policy_and_engine

        configure_cpu_process(cluster.num_cpu_threads, cpu_compute=False)
        for line in switch_lines:
            announce(line)
        policy, engine = build_ray_policy_and_engine(
            policy_cfg, spec, cfg.grpo.seed, init_reference_model=init_reference_model
        )
        return Placement(policy, engine, torch.device("cpu"), True)
    plan, startup = ParallelPlan.single(), None
    if spec.backend == "torchrun":
        device = init_torchrun(cluster.device)
        if tp > 1:  # before loading the model on every rank
            from nemo_jetrl.policy.parallel.tensor_parallel import check_tp_model

            check_tp_model(policy_cfg.model_name, tp)
        plan = ParallelPlan.from_process_group(device, tp)
        startup = startup_line(spec.num_workers, tp, device)
        for line in switch_lines if plan.is_main else ():
            announce(line)
    else:
        device = resolve_device(cluster.device)
    configure_cpu_process(cluster.num_cpu_threads, cpu_compute=device.type == "cpu")
    policy = NativePolicy(
        policy_cfg, PrecisionRecipe.from_config(policy_cfg), device, plan=plan,
        init_reference_model=init_reference_model, seed=cfg.grpo.seed,
    )  # fmt: skip
    engine = build_local_engine(
        policy_cfg.generation, policy, spec, device, max_total_length=policy_cfg.max_total_sequence_length,
        seed=cfg.grpo.seed,
    )  # fmt: skip
    return Placement(policy, engine, device, plan.is_main, startup)


def start_ranks(cfg: RunConfig) -> bool:
    """torchrun: start this rank's process group (NCCL on CUDA, gloo on CPU). True where this process writes and
    prints: rank 0, or any run that is not torchrun."""
    if cfg.cluster.backend != "torchrun":
        return True
    init_torchrun(cfg.cluster.device)
    main = torch.distributed.get_rank() == 0
    if not main:  # the weight-loading progress bars too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return main


def sync_ranks(cfg: RunConfig) -> None:
    """torchrun: every rank waits here for the others (rank 0's preparation of the output directories)."""
    if cfg.cluster.backend == "torchrun":
        torch.distributed.barrier()
