"""One rank of `test_tensor_parallel_gloo.py` (run under torchrun, gloo): TP x DP FP8 training step + TP rollout
against the single-process trainer / rollout computed on the same rank. Writes rank<r>.pt with what it observed.

argv: dp tp out_dir compute_dtype(float32|bfloat16)
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.policy.parallel.fsdp import clip_grads, shard_policy, total_grad_norm
from nemo_jetrl.policy.parallel.tensor_parallel import (
    COLWISE,
    build_tp_rollout_replica,
    parallelize_decoder,
    reduce_head_local_grads,
)
from nemo_jetrl.policy.parallel.weight_sync import Fp8Refit
from nemo_jetrl.precision import (
    Fp8Linear,
    Fp8RolloutLinear,
    PrecisionRecipe,
    build_rollout_replica,
    convert_to_fp8,
    invalidate_fp8_caches,
)

# 4 q heads x 128, 2 KV heads x 128, intermediate 512: every per-rank dim is whole 128-tiles at TP=2
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128)
ROWS, SEQ, RESPONSE = 8, 12, 6


def batch() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 32, (ROWS, SEQ), generator=g)
    mask = torch.ones(ROWS, SEQ, dtype=torch.long)
    for r in range(ROWS):
        mask[r, : r % 3] = 0  # left pads
    response = torch.zeros_like(mask)
    response[:, -RESPONSE:] = 1
    adv = torch.randn(ROWS, generator=g)
    return ids, mask, response, adv


def loss_of(logp, response, adv, normalizer):
    return -(logp * adv[:, None] * response).sum() / normalizer


def fp8_bits(model) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, Fp8Linear) and m.rollout_fp8:
            q = m.quantized_weight()
            out[name] = (q.data.view(torch.uint8).clone(), q.scale.clone())
        elif isinstance(m, Fp8RolloutLinear):
            out[name] = (m.weight_fp8.view(torch.uint8).clone(), m.weight_scale.clone())
    return out


def tp_slice(bits: dict, rank: int, tp: int) -> dict:
    """The reference's full FP8 bits/scales cut to TP rank `rank`'s shard."""
    out = {}
    for name, (data, scale) in bits.items():
        dim = 0 if name.endswith(tuple(COLWISE)) else 1
        n, s = data.shape[dim] // tp, scale.shape[dim] // tp
        out[name] = (data.narrow(dim, rank * n, n), scale.narrow(dim, rank * s, s))
    return out


def rollout_engine(replica, dtype) -> NativeGenerationEngine:
    return NativeGenerationEngine(
        replica, max_new_tokens=8, stop_token_ids=[2], pad_token_id=0, compute_dtype=dtype, kv_cache_dtype=None
    )


def greedy(replica, dtype):
    prompts = [[1, 5, 9, 4], [1, 7, 3], [1, 12, 30, 8, 6], [1, 4]]
    return rollout_engine(replica, dtype).generate(prompts, greedy=True)


def train_step(model, root, rows, normalizer, dtype):
    """Forward + backward of `rows` of the batch (globally normalized loss); (loss, logp, optimizer)."""
    ids, mask, response, adv = (t[rows] for t in batch())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if root is None:
        logp = sequence_logprobs(model, ids, mask, compute_dtype=dtype)
    else:
        logp = root(ids, mask)
    loss = loss_of(logp, response, adv, normalizer)
    loss.backward()
    return loss.detach(), logp.detach(), optimizer


def reference_step(model, dp, normalizer, dtype):
    """The single process on the same micro-batches as the DP ranks (FP8 WGrad quantizes X^T in groups of 128
    tokens: the token count of a micro-batch is part of the math)."""
    per = ROWS // dp
    parts = [train_step(model, None, slice(i * per, (i + 1) * per), normalizer, dtype) for i in range(dp)]
    return sum(p[0] for p in parts), torch.cat([p[1] for p in parts]), parts[0][2]


def main() -> None:
    dp, tp, out_dir, dtype_name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dtype = getattr(torch, dtype_name)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    recipe = PrecisionRecipe.preset("jetrl")
    base = random_tiny_qwen3(0, **SHAPE).train()
    normalizer = float(batch()[2].sum())
    # ---- reference: one process, the whole batch
    ref = copy.deepcopy(base)
    convert_to_fp8(ref, recipe)
    ref0_out = greedy(build_rollout_replica(ref), dtype)  # the rollout before any update
    ref_loss, ref_logp, opt = reference_step(ref, dp, normalizer, dtype)
    ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0))
    opt.step()
    ref_bits = fp8_bits(ref)
    ref_replica = build_rollout_replica(ref)
    ref_out = greedy(ref_replica, dtype)
    # ---- TP x DP
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    tp_rank, dp_rank = mesh["tp"].get_local_rank(), mesh["dp"].get_local_rank()
    model = copy.deepcopy(base)
    convert_to_fp8(model, recipe)
    replica = build_tp_rollout_replica(model, tp_rank, tp, mesh["tp"].get_group())
    # the TP rollout before any update, on the very weights of the reference's: its greedy tokens and its logprobs
    # of the reference's tokens (teacher-forced replay)
    tokens0 = greedy(replica, dtype).input_ids
    scored0 = rollout_engine(replica, dtype).score(ref0_out.input_ids, ref0_out.attention_mask, ref0_out.prompt_length)
    parallelize_decoder(model, mesh["tp"])
    root = shard_policy(model, temperature=1.0, compute_dtype=dtype, mesh=mesh["dp"])
    per = ROWS // dp
    rows = slice(dp_rank * per, (dp_rank + 1) * per)
    loss, logp, opt = train_step(model, root, rows, normalizer, dtype)
    reduce_head_local_grads(model, mesh["tp"].get_group())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = total_grad_norm(grads)
    clip_grads(grads, 1.0, grad_norm)
    grad_norm = float(grad_norm)
    opt.step()
    invalidate_fp8_caches(model)
    total_loss = loss.detach().clone()
    dist.all_reduce(total_loss, group=mesh["dp"].get_group())
    refit = Fp8Refit(model, replica, group=mesh["dp"].get_group()).refit()
    tokens = greedy(replica, dtype).input_ids
    torch.save(
        {
            "ref": {
                "loss": float(ref_loss),
                "grad_norm": ref_norm,
                "logp": ref_logp[rows],
                "tokens": ref_out.input_ids,
                "tokens0": ref0_out.input_ids,
            },
            "tp": {
                "loss": float(total_loss),
                "grad_norm": grad_norm,
                "logp": logp.detach(),
                "tokens": tokens,
                "tokens0": tokens0,
            },
            "rollout0_logp": (ref0_out.generation_logprobs, scored0),
            "ref_bits": tp_slice(ref_bits, tp_rank, tp),
            "bits": fp8_bits(replica),
            "refit": refit.metrics(),
            "tp_rank": tp_rank,
            "dp_rank": dp_rank,
        },
        f"{out_dir}/rank{rank}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
