"""The FP8 training step on CUDA: the fused AdamW's update reaches the FP8 weights (the trainer's and the rollout's),
and the grouped q/k/v, gate/up training GEMMs agree with the per-linear ones through scaled_mm."""

import pytest
import torch
from jetrl_testkit.sibling_linears import sibling_linear_grads

from benchmarks.bench_train_step import make_batch
from benchmarks.common import LOSS, TINY, build_model, policy_config
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, weight_quant

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def test_fp8_weights_follow_the_fused_adamw_step():
    model = build_model(TINY, None, DEV, torch.bfloat16).train()
    optimizer = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "betas": (0.9, 0.999), "eps": 1e-8}
    policy = NativePolicy(
        policy_config(optimizer=optimizer), PrecisionRecipe.preset("jetrl"), DEV, model=model
    )
    assert policy.optimizer.defaults.get("fused")
    policy.prepare_refit()
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    before = [m.quantized_weight().scale.clone() for m in layers]
    batch = make_batch(2, 128, TINY["vocab_size"])
    batch.advantages = -1.0 - batch.advantages.abs()  # < 0: the clipped objective keeps a gradient at ratio >> 1
    policy.train(batch, LOSS)
    policy.prepare_refit()
    changed = 0
    for m, old in zip(layers, before):
        qw = m.quantized_weight()
        data, scale = weight_quant(m.weight.detach(), 128)
        assert torch.equal(qw.data.view(torch.uint8), data.view(torch.uint8)) and torch.equal(qw.scale, scale)
        changed += not torch.equal(qw.scale, old)  # a tile's amax moved (e4m3 values may not, at 3 mantissa bits)
    assert changed == len(layers)  # lr 1e-3: every layer's bf16 master weights moved


@pytest.mark.parametrize("wgrad_x_blocks", ["1x128", "128x128"])
def test_grouped_training_gemms_match_per_linear_ones(wgrad_x_blocks):
    recipe = PrecisionRecipe.preset("jetrl", wgrad_x_blocks=wgrad_x_blocks)
    splits, k, m_tokens = (4096, 1024, 1024), 4096, 2048
    outs = [sibling_linear_grads(recipe, grouped, k, splits, m_tokens, DEV) for grouped in (False, True)]

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())

    (y0, dx0, dw0), (y1, dx1, dw1) = outs
    assert all(rel(a, b) < 1e-2 for a, b in zip(y1, y0))  # bf16 outputs: same products, accumulation order
    assert rel(dx1, dx0) < 1e-2
    assert all(rel(a, b) < 1e-2 for a, b in zip(dw1, dw0))


@pytest.mark.parametrize(
    "preset,packing,graphs",
    [("bf16", False, False), ("jetrl", False, False), ("jetrl", True, False), ("jetrl", False, True)],
)
def test_train_step_syncs_with_the_host_once(preset, packing, graphs, monkeypatch):
    """No host sync between micro-batches (the launch queue stays ahead of the device): CUDA's sync debug mode
    raises on any sync until the step reads its metrics, non-finite checks and grad norm together. With
    policy.train_cuda_graphs the checked step replays every micro-batch (warm-up steps ran it eagerly and captured it)."""
    import nemo_jetrl.policy.trainer_core as native

    model = build_model(TINY, None, DEV, torch.bfloat16).train()
    pack = {"enabled": True, "train_mb_tokens": 256, "logprob_mb_tokens": 256} if packing else {}
    cfg = policy_config(sequence_packing=pack, train_cuda_graphs=graphs)
    policy = NativePolicy(cfg, PrecisionRecipe.preset(preset), DEV, model=model)
    batch = make_batch(3, 128, TINY["vocab_size"])
    batch.attention_mask[1, :40] = 0  # a left-padded row
    batch.response_mask[1, :40] = 0
    for _ in range(2 if graphs else 1):  # warm-up: first-call allocations, kernel compilation, captures may sync
        policy.train(batch, LOSS)
    reads = []
    real_read = native.metrics_to_floats

    def read(metrics):
        reads.append(len(metrics))
        torch.cuda.set_sync_debug_mode(0)
        return real_read(metrics)

    monkeypatch.setattr(native, "metrics_to_floats", read)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = policy.train(batch, LOSS)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    n_micro = 2 if packing else 3  # 128 + 88 tokens share a packed 256-token row
    assert reads == [2 * n_micro + 1]  # one read: each micro-batch's metrics and checks, the step's checks
    assert out["num_micro_batches"] == float(n_micro) and out["grad_norm"] > 0
    if graphs:
        assert out["cuda_graph_replay_fraction"] == 1.0 and policy.train_graphs.captures == 1  # one shape
