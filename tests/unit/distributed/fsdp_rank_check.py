"""One rank of test_fsdp_gloo.py (launched by torchrun, 2 CPU ranks, gloo). Not collected by pytest.

Runs a `PolicyWorker` (the Ray worker body, without Ray: the trainer of this rank, `NativePolicy` on the "fsdp"
plan) against the single-process reference the test saved, and writes what it observed to `<out>/rank<r>.pt`; the
test asserts on it.

    python -m torch.distributed.run --nproc-per-node 2 fsdp_rank_check.py REFERENCE.pt OUT_DIR
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # jetrl_testkit
from jetrl_testkit.live_bytes import StepBytes  # noqa: E402

from nemo_jetrl.algorithms.config import LossConfig  # noqa: E402
from nemo_jetrl.algorithms.loss import ClippedPGLossFn  # noqa: E402
from nemo_jetrl.distributed.worker import PolicyWorker
from nemo_jetrl.policy.parallel import weight_sync
from nemo_jetrl.policy.parallel.fsdp import shard_policy
from nemo_jetrl.policy.parallel.weight_sync import Fp8Refit
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, weight_quant
from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear, build_rollout_replica


def fp8_bits(replica: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {
        n: (m.weight_fp8.view(torch.uint8).clone(), m.weight_scale.clone())
        for n, m in replica.named_modules()
        if isinstance(m, Fp8RolloutLinear)
    }


def toy_fallback_refit(rank: int) -> dict:
    """A 128x128 FP8 weight over 2 ranks: 64-row shards straddle a tile, so refit gathers the master instead."""
    torch.manual_seed(0)
    toy = torch.nn.Module()
    toy.layers = torch.nn.ModuleList([torch.nn.Module()])
    toy.layers[0].proj = Fp8Linear(128, 128, bias=False, recipe=PrecisionRecipe.preset("jetrl"))
    full = toy.layers[0].proj.weight.detach().clone()
    replica = build_rollout_replica(toy)
    shard_policy(toy, temperature=1.0, compute_dtype=None)  # root forward is never called here
    stats = Fp8Refit(toy, replica).refit()
    data, scale = weight_quant(full)
    got = replica.layers[0].proj
    return {
        "fallback": stats.fallback_weights,
        "equal": torch.equal(got.weight_fp8.view(torch.uint8), data.view(torch.uint8))
        and torch.equal(got.weight_scale, scale),
    }


SMALL_BUCKET = 256 << 10  # bytes: the tiny model's FP8 refit then takes several all-gathers


def small_bucket_refit(policy) -> dict:
    """Refit into a wiped replica with SMALL_BUCKET buckets; the all-gather sizes and the bits that arrive."""
    for module in policy.rollout_model.modules():
        if isinstance(module, Fp8RolloutLinear):
            module.weight_fp8.view(torch.uint8).zero_()
    policy.rollout_model.get_parameter("model.embed_tokens.weight").zero_()
    sizes, real = [], weight_sync._ALL_GATHER
    weight_sync._ALL_GATHER = lambda out, flat, group=None: sizes.append(flat.numel()) or real(out, flat, group=group)
    try:
        weight_sync.Fp8Refit(policy.model, policy.rollout_model, bucket_bytes=SMALL_BUCKET).refit()
    finally:
        weight_sync._ALL_GATHER = real
    return {"sizes": sizes, "bits": fp8_bits(policy.rollout_model), "other": replica_other(policy.rollout_model)}


def replica_other(replica: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The replica's non-FP8 tensors (embeddings, norms, lm_head), as received."""
    return {n: p.detach().clone() for n, p in replica.named_parameters()}


def main(reference_path: str, out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    ref = torch.load(reference_path, weights_only=False)
    worker = PolicyWorker(rank, int(os.environ["WORLD_SIZE"]), use_gpu=False, num_cpu_threads=1)
    worker.init_distributed(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), "gloo", 120)
    worker.setup(ref["setup"])  # the Ray worker's body: the trainer of this rank (plan "fsdp") + its rollout engine
    policy = worker.policy
    result: dict = {"setup_refit": policy.prepare_refit(), "bits_setup": fp8_bits(policy.rollout_model)}
    batch = ref["batch"]  # prev_logprobs unset
    result["logprobs"] = policy.get_logprobs(batch)  # every rank: the whole batch's, in the one-process layout
    status, logp0, mirror = worker.call("get_logprobs", batch)  # as the Ray driver reads it: rank 0 answers
    result["worker_call"] = (status, logp0, mirror)
    batch.prev_logprobs = ref["logprobs"]
    loss_fn = ClippedPGLossFn(LossConfig.model_validate(ref["loss_fn"]))
    with StepBytes(policy.model) as probe:  # what the micro-batches hold at each logits chunk
        result["train"] = policy.train(batch, loss_fn)  # 3 micro-batches: rank 0 runs two, rank 1 one + a dummy
    result["step_bytes"] = probe.samples
    result["refit"] = policy.prepare_refit()
    result["bits_step1"] = fp8_bits(policy.rollout_model)
    result["state"] = policy.state_dict()

    # resume path: load the single-process state after its step, then logprobs must equal its logprobs
    policy.load_state_dict(ref["state_step1"])
    batch.prev_logprobs = None
    result["logprobs_after_load"] = policy.get_logprobs(batch)
    result["bits_after_load"] = fp8_bits(policy.rollout_model)

    # the BF16 baseline refit (bytes / time), then FP8 again
    result["bf16_refit"] = policy.refitter.refit("bf16").metrics()
    result["bits_bf16_refit"] = fp8_bits(policy.rollout_model)
    result["fp8_refit"] = policy.refitter.refit("fp8").metrics()
    result["small_bucket"] = small_bucket_refit(policy)
    result["toy"] = toy_fallback_refit(rank)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    worker.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
