"""`use_deep_gemm` on an sm90 GPU where deep_gemm imports (benchmarks/build_deepgemm.sh): DeepGEMM's blockwise
products are as close to the exact product as cuBLAS's (bit for bit cuBLAS's at the training shapes tested), and
the captured trainer on DeepGEMM replays the eager one bit for bit (DeepGEMM actually running in each)."""

import pytest
import torch
from jetrl_testkit.sibling_linears import sibling_linear_grads

from benchmarks.bench_train_step import make_batch
from benchmarks.common import LOSS, TINY, build_model, policy_config
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, deep_gemm_adapter
from nemo_jetrl.precision.gemm import fp8_blockwise_mm
from nemo_jetrl.precision.linear import rollout_mode
from nemo_jetrl.precision.quant import act_quant, weight_quant

DEV = torch.device("cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not deep_gemm_adapter.usable(DEV),
        reason="needs deep_gemm on an sm90 GPU (benchmarks/build_deepgemm.sh)",
    ),
]
OPT = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "betas": (0.9, 0.999), "eps": 1e-8}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("m", [7, 128, 1000, 4096])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288)])
def test_deep_gemm_is_as_close_to_the_exact_product_as_cublas(m, n, k):
    """FProp and DGrad operands of the recipe; the reference is the exact product of the same FP8 values (FP32
    emulation). DeepGEMM's FP32 sums may differ from cuBLAS's in the last bits (they did at M = 7, K = 12,288)."""
    gen = torch.Generator(device=DEV).manual_seed(m + n + k)
    xq, xs = act_quant(torch.randn(m, k, device=DEV, generator=gen, dtype=torch.bfloat16))
    wq, ws = weight_quant(torch.randn(n, k, device=DEV, generator=gen, dtype=torch.bfloat16) * 0.02)
    dyq, dys = act_quant(torch.randn(m, n, device=DEV, generator=gen, dtype=torch.bfloat16))
    wt, wts = wq.t().contiguous(), ws.t().contiguous()  # DGrad: the same tiles transposed, W^T [K, N]
    for a, a_s, b, b_s in ((xq, xs, wq, ws), (dyq, dys, wt, wts)):
        exact = fp8_blockwise_mm(a, a_s, b, b_s, torch.float32, backend="emulated")  # [M, N] or [M, K]
        cublas = fp8_blockwise_mm(a, a_s, b, b_s, torch.bfloat16, backend="scaled_mm")
        ours = deep_gemm_adapter.fp8_gemm(a, a_s, b, b_s)
        assert ours.dtype == torch.bfloat16 and ours.shape == cublas.shape
        assert rel(ours, exact) <= 1.05 * rel(cublas, exact) + 1e-7  # both: the bf16 rounding of the output
        assert (ours.float() - cublas.float()).abs().max() <= 2 * cublas.float().abs().max() * 2**-8


@pytest.fixture
def deep_gemm_calls(monkeypatch):
    calls = []
    real = deep_gemm_adapter.fp8_gemm

    def counted(*args):
        calls.append(tuple(args[0].shape))
        return real(*args)

    monkeypatch.setattr(deep_gemm_adapter, "fp8_gemm", counted)
    return calls


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("k,splits,m", [(256, (256, 128, 128), 512), (4096, (4096, 1024, 1024), 4096)])
def test_training_linears_on_deep_gemm_give_the_cublas_bits(grouped, k, splits, m, deep_gemm_calls):
    """At these shapes (the tiny test model's, Qwen3-8B's q/k/v at a 4K-token micro-batch) DeepGEMM's FProp and
    DGrad sums came out bit for bit cuBLAS's on an H100; WGrad runs on cuBLAS either way."""
    ys, dx, dws = sibling_linear_grads(PrecisionRecipe.preset("jetrl"), grouped, k, splits, m, DEV)
    assert deep_gemm_calls == []
    recipe = PrecisionRecipe.preset("jetrl", use_deep_gemm=True)
    ys_dg, dx_dg, dws_dg = sibling_linear_grads(recipe, grouped, k, splits, m, DEV)
    assert len(deep_gemm_calls) == (2 if grouped else 2 * len(splits))  # FProp + DGrad, per group or per linear
    for a, b in zip([*ys_dg, dx_dg, *dws_dg], [*ys, dx, *dws]):
        assert torch.equal(bits(a), bits(b))


def train(graphs: bool, steps: int = 4):
    """4 sequences of 128 tokens (one attention block: a deterministic SDPA backward) in ONE micro-batch of 512 rows
    (no small-M tuner), a left-padded row, AdamW at lr 1e-3; then a rollout-mode forward of 384 rows."""
    model = build_model(TINY, None, DEV, torch.bfloat16).train()
    cfg = policy_config(optimizer=OPT, train_cuda_graphs=graphs, train_micro_batch_size=4)
    policy = NativePolicy(cfg, PrecisionRecipe.preset("jetrl", use_deep_gemm=True), DEV, model=model)
    metrics = []
    for step in range(steps):
        batch = make_batch(4, 128, TINY["vocab_size"])
        batch.advantages = torch.linspace(-1.0, 1.0, 4) * (1 + step)
        batch.attention_mask[1, :40] = 0
        batch.response_mask[1, :41] = 0
        out = policy.train(batch, LOSS)
        out.pop("cuda_graph_replay_fraction", None)
        metrics.append(out)
        policy.prepare_refit()
    ids = make_batch(3, 128, TINY["vocab_size"]).input_ids.to(DEV)
    with torch.no_grad(), rollout_mode(model):
        logits = model(ids).logits  # [3, 128, V], the rollout's prefill forward
    return policy, metrics, logits


def test_captured_trainer_steps_on_deep_gemm_equal_eager_ones(deep_gemm_calls):
    eager, m_eager, logits_eager = train(graphs=False)
    assert len(deep_gemm_calls) >= 4 * 2 * 4  # 4 steps x FProp + DGrad x 4 GEMMs per layer (2 grouped, o, down)
    graphed, m_graph, logits_graph = train(graphs=True)
    assert graphed.train_graphs is not None and graphed.train_graphs.replays == 3  # step 0 eager, then replayed
    assert m_graph == m_eager
    for a, b in zip(eager.model.parameters(), graphed.model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(eager.model.modules(), graphed.model.modules()):
        if isinstance(a, Fp8Linear):
            assert torch.equal(a.quantized_weight().data.view(torch.uint8), b.quantized_weight().data.view(torch.uint8))
    assert torch.equal(bits(logits_graph), bits(logits_eager))
