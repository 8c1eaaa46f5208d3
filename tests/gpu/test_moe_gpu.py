"""MoE on CUDA at the Qwen3-30B-A3B expert shapes: the grouped FP8 expert GEMM bit for bit the batch-invariant kernel
per expert (decode- and training-sized routings) and close to the exact emulation; FP8 expert training within FP8's
bounds of FP32; BF16 experts through `F.grouped_mm`; a tiny MoE's decode step captured in a CUDA graph, its routing
recorded there, and in the exact mode the rollout's experts and logprobs the trainer's bit for bit.

Run: `python -m pytest -q -m gpu tests/gpu/test_moe_gpu.py` (docs/moe.md).
"""

import pytest
import torch

from nemo_jetrl.precision import PrecisionRecipe, act_quant
from nemo_jetrl.precision.expert_linear import ExpertLinear, ExpertSplit, Fp8ExpertLinear, expert_linear
from nemo_jetrl.precision.recipes import BLOCKWISE

pytestmark = pytest.mark.gpu
DEV = "cuda"
E, TOP_K, HIDDEN, FFN = 128, 8, 2048, 768  # Qwen3-30B-A3B
SHAPES = [(2 * FFN, HIDDEN), (HIDDEN, FFN)]  # (N, K): gate_up, down


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def routed_counts(tokens: int, seed: int) -> torch.Tensor:
    """Rows per expert of `tokens` tokens each routed to TOP_K distinct experts (a skewed, realistic spread)."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    logits = torch.randn(tokens, E, device=DEV, generator=gen) + torch.linspace(0, 2, E, device=DEV)
    experts = logits.topk(TOP_K, dim=-1).indices.flatten()
    return torch.zeros(E, dtype=torch.long, device=DEV).scatter_add_(0, experts, torch.ones_like(experts))


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("tokens", [128, 4096])  # a decode batch, a training micro-batch
def test_grouped_gemm_is_the_batch_invariant_kernel_per_expert(n, k, tokens):
    from nemo_jetrl.precision.batch_invariant import fp8_mm_ref
    from nemo_jetrl.precision.kernels import triton_batch_invariant as T
    from nemo_jetrl.precision.kernels.triton_grouped_gemm import grouped_fp8_gemm

    counts = routed_counts(tokens, n + tokens)
    gen = torch.Generator(device=DEV).manual_seed(k)
    x = torch.randn(int(counts.sum()), k, device=DEV, generator=gen)
    w = torch.randn(E, n, k, device=DEV, generator=gen) * 0.02
    xq, xs = act_quant(x)
    wq, ws, _ = BLOCKWISE.expert_weight_quant(w, PrecisionRecipe.preset("jetrl"))
    y = grouped_fp8_gemm(xq, xs, wq, ws, counts, torch.bfloat16)
    y_other_tiles = grouped_fp8_gemm(xq, xs, wq, ws, counts, torch.bfloat16, config=(128, 128, 8, 3))
    assert torch.equal(y, y_other_tiles)
    lo = 0
    for e, c in enumerate(counts.tolist()):
        if c and e % 16 == 0:  # every 16th expert: alone through the dense batch-invariant kernel
            rows = slice(lo, lo + c)
            alone = T.fp8_gemm(xq[rows], xs[rows], wq[e], ws[e], torch.bfloat16, split=False)
            assert torch.equal(y[rows], alone)
            ref = fp8_mm_ref(xq[rows].cpu(), xs[rows].cpu(), wq[e].cpu(), ws[e].cpu(), torch.float32)  # CPU twin
            assert rel_err(y[rows].cpu(), ref) < 5e-3
        lo += c


def test_fp8_expert_training_on_cuda_stays_within_fp8_bounds():
    counts = routed_counts(512, 0)
    split = ExpertSplit(counts)
    gen = torch.Generator(device=DEV).manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(E, 2 * FFN, HIDDEN, device=DEV, generator=gen) * 0.02)
    fp8 = Fp8ExpertLinear.from_expert_linear(ExpertLinear(weight), PrecisionRecipe.preset("jetrl"))
    x = torch.randn(int(counts.sum()), HIDDEN, device=DEV, generator=gen, dtype=torch.bfloat16, requires_grad=True)
    x_ref = x.detach().float().requires_grad_(True)
    y = fp8(x, split)  # grouped FProp, per-expert DGrad / WGrad on scaled_mm
    ref = expert_linear(x_ref, weight.float(), split, exact=False)
    grad = torch.randn_like(y)
    y.backward(grad)
    w_grad = weight.grad.clone()
    weight.grad = None
    ref.backward(grad.float())
    assert rel_err(y, ref) < 0.05 and rel_err(x.grad, x_ref.grad) < 0.05 and rel_err(w_grad, weight.grad) < 0.05
    with torch.no_grad():
        fp8.mode = "rollout"
        assert torch.equal(fp8(x.detach(), split), y.detach())  # the rollout's FProp is the trainer's, bit for bit


def test_bf16_experts_grouped_mm_matches_the_loop():
    counts = routed_counts(256, 2)
    split = ExpertSplit(counts)
    gen = torch.Generator(device=DEV).manual_seed(3)
    w = torch.randn(E, HIDDEN, FFN, device=DEV, generator=gen, dtype=torch.bfloat16) * 0.02
    x = torch.randn(int(counts.sum()), FFN, device=DEV, generator=gen, dtype=torch.bfloat16)
    with torch.no_grad():
        grouped = expert_linear(x, w, split, exact=False)  # F.grouped_mm
    looped = expert_linear(x.requires_grad_(True), w, split, exact=False)  # with grad: F.linear per expert
    assert rel_err(grouped, looped) < 1e-2


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_moe_rollout_captures_and_records_and_the_exact_mode_matches_the_trainer(mode):
    from benchmarks.common import policy_config
    from nemo_jetrl.generation.native.engine import NativeGenerationEngine
    from nemo_jetrl.models.tiny import random_tiny_qwen3_moe
    from nemo_jetrl.policy.interfaces import TrainBatch
    from nemo_jetrl.policy.native import NativePolicy

    cfg = policy_config(master_dtype="float32", generation={"deterministic": mode == "exact"}, logprob_batch_size=5)
    model = random_tiny_qwen3_moe(0).to(DEV)
    policy = NativePolicy(cfg, PrecisionRecipe.preset("jetrl"), torch.device(DEV), model=model)
    engine = NativeGenerationEngine(
        policy.model, max_new_tokens=24, stop_token_ids=[], pad_token_id=0, compute_dtype=torch.bfloat16,
        cuda_graphs=True,
    )  # fmt: skip
    assert engine.cuda_graphs  # the grouped expert GEMM reads no count on the host: the decode step captures
    prompts = [[1, *range(2, 2 + n)] for n in (5, 9, 3, 12, 7, 2, 10, 4)]
    out = engine.generate(prompts, generator=torch.Generator(device=DEV).manual_seed(0))
    batch = TrainBatch(out.input_ids.cpu(), out.attention_mask.cpu(), out.response_mask.cpu(), torch.zeros(8),
                       out.generation_logprobs.cpu(), generation_routing=out.routed_experts.cpu())  # fmt: skip
    logp = policy.get_logprobs(batch)
    agreement = policy.routing.pop_metrics()["routing_agreement"]
    scored = batch.response_mask.bool()
    if mode == "exact":
        assert agreement == 1.0 and torch.equal(logp[scored], batch.generation_logprobs[scored])
    else:
        assert agreement > 0.9
