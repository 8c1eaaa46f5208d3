"""CUDA fast decode: graph-captured decode == eager decode, Triton decode attention == reference, FP8 KV, replay.

Run on a GPU box: `PYTHONPATH=. python3 -m pytest tests/gpu/test_cuda_graph_decode.py -q`.
"""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from nemo_jetrl.generation.native.decode_attention import decode_attention, decode_attention_ref
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.kv import kv_quant

pytestmark = pytest.mark.gpu

PAD, VOCAB, MAX_NEW = 0, 64, 40


def tiny_qwen3(dtype=torch.bfloat16) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=VOCAB,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    return Qwen3ForCausalLM(cfg).to(dtype).cuda().eval()


def prompts(n: int = 12) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [
        torch.randint(1, VOCAB, (int(k),), generator=gen).tolist() for k in torch.randint(1, 20, (n,), generator=gen)
    ]


def engine(model, **kw) -> NativeGenerationEngine:
    kw.setdefault("stop_token_ids", [VOCAB - 1])
    return NativeGenerationEngine(model, max_new_tokens=MAX_NEW, pad_token_id=PAD, **kw)


def kv_scales(layers: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((layers,), 0.04), torch.full((layers,), 0.02)


@pytest.mark.parametrize("variant", ["bf16", "fp8", "fp8+kv"])
def test_cuda_graph_greedy_equals_eager_greedy(variant):
    """Captured decode == the same static decode run eagerly: tokens and logprobs bitwise, mixed stop lengths."""
    model = tiny_qwen3()
    kw = {}
    if variant != "bf16":
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    if variant == "fp8+kv":
        kw["kv_cache_dtype"] = "fp8"
    graphed = engine(model, cuda_graphs=True, **kw)
    eager = engine(model, cuda_graphs=False, static_decode=True, sync_every=1, **kw)
    for eng in (graphed, eager):
        eng.update_weights(kv_scales=kv_scales())
    a = graphed.generate(prompts(), greedy=True)
    b = eager.generate(prompts(), greedy=True)
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.response_mask, b.response_mask) and torch.equal(a.finished, b.finished)
    diff = (a.generation_logprobs - b.generation_logprobs).abs().max().item()
    print(f"{variant}: graph vs eager max |logprob diff| = {diff:.3g}")
    assert diff <= 1e-5
    assert a.finished.any() and a.response_lengths.min() < a.response_lengths.max()  # rows stop at different steps
    captured, eager_parts = graphed.rollout_timings(), eager.rollout_timings()
    assert captured["cuda_graph_capture"] > 0 and eager_parts["cuda_graph_capture"] == 0.0
    assert min(captured["prefill"], captured["decode"], eager_parts["prefill"], eager_parts["decode"]) > 0


def test_cuda_graph_sampling_and_deterministic_replay():
    """Seeded sampling under graphs is reproducible; `score` replays it bit for bit (gen_kl_error == 0)."""
    model = tiny_qwen3()
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    eng = engine(model, cuda_graphs=True, kv_cache_dtype="fp8", temperature=0.9)
    eng.update_weights(kv_scales=kv_scales())
    out = eng.generate(prompts(), generator=torch.Generator(device="cuda").manual_seed(5))
    again = eng.generate(prompts(), generator=torch.Generator(device="cuda").manual_seed(5))
    assert torch.equal(out.input_ids, again.input_ids)
    replay = eng.score(out.input_ids, out.attention_mask, out.prompt_length)
    assert torch.equal(replay, out.generation_logprobs)


def test_fused_decode_matches_sdpa_decode():
    """Triton decode attention over the stored cache vs the SDPA path (dequantized copy): same greedy tokens."""
    model = tiny_qwen3(torch.float32)
    fused = engine(model, cuda_graphs=True)
    sdpa = engine(model, fused_decode=False, static_decode=True)
    a = fused.generate(prompts(), greedy=True)
    b = sdpa.generate(prompts(), greedy=True)
    assert torch.equal(a.input_ids, b.input_ids)
    assert (a.generation_logprobs - b.generation_logprobs).abs().max().item() <= 1e-3


@pytest.mark.parametrize(
    ("fp8", "impl", "heads"),
    [(False, "triton", 32), (True, "triton", 32), (True, "cuda", 32), (True, "cuda", 28), (True, "cuda", 8)],
    ids=["bf16", "fp8-triton", "fp8-cuda", "fp8-cuda-nrep7", "fp8-cuda-nrep1"],
)
def test_decode_attention_kernels_match_reference(fp8, impl, heads):
    torch.manual_seed(0)
    B, H, Hk, S, D = 5, heads, 8 if heads != 28 else 4, 777, 128
    q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
    valid = torch.rand(B, S, device="cuda") > 0.2
    valid[:, 600] = True
    ks = vs = None
    if fp8:
        ks, vs = (torch.tensor(3.0 / 448, device="cuda") for _ in range(2))
        k, v = kv_quant(k, ks), kv_quant(v, vs)
    kv_len = torch.tensor(601, device="cuda")
    ref = decode_attention_ref(q, k, v, valid, 601, 0.088, ks, vs)
    for splits in (None, 1, 3, 4):
        out = decode_attention(q, k, v, valid, kv_len, 0.088, ks, vs, num_splits=splits, impl=impl)
        err = (out.float() - ref.float()).norm() / ref.float().norm()
        assert err.item() < (2e-3 if fp8 else 1e-2), (splits, err.item())


@pytest.mark.parametrize("keys", [1, 17, 250])
def test_cuda_fp8_decode_attention_in_a_graph_follows_kv_len(keys):
    """The CUDA kernel reads kv_len from the device: one captured graph serves every length, short ones included."""
    torch.manual_seed(1)
    q = torch.randn(8, 32, 128, device="cuda", dtype=torch.bfloat16)
    scale = torch.tensor(3.0 / 448, device="cuda")
    k, v = (kv_quant(torch.randn(8, 8, 300, 128, device="cuda", dtype=torch.bfloat16), scale) for _ in range(2))
    valid = torch.ones(8, 300, dtype=torch.bool, device="cuda")
    kv_len = torch.tensor(200, device="cuda")
    decode_attention(q, k, v, valid, kv_len, 0.088, scale, scale, impl="cuda")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, valid, kv_len, 0.088, scale, scale, impl="cuda")
    kv_len.fill_(keys)
    graph.replay()
    ref = decode_attention_ref(q, k, v, valid, keys, 0.088, scale, scale)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_fused_kv_write_is_bitwise_the_cache_update(dtype):
    """One-launch K/V write (`write_decode_kv`) == `KVCache.update`: same bytes, e4m3 rounding and saturation."""
    from nemo_jetrl.generation.native.decode_attention import write_decode_kv
    from nemo_jetrl.generation.native.kv_cache import KVCache

    torch.manual_seed(0)
    ref, fused = (KVCache(2, 6, 8, 40, 128, dtype=dtype, device="cuda") for _ in range(2))
    if dtype != torch.bfloat16:
        for cache in (ref, fused):
            cache.set_scales(torch.tensor([0.01, 0.023], device="cuda"), torch.tensor([0.031, 0.004], device="cuda"))
    for pos in (0, 17, 39):
        for layer in (0, 1):
            k = (3 * torch.randn(6, 1, 8, 128, device="cuda")).bfloat16().transpose(1, 2)  # [B, H_kv, 1, D] view
            v = (3 * torch.randn(6, 1, 1200, device="cuda")).bfloat16()[..., 100:1124].view(6, 1, 8, 128)
            k[0, 0, 0, :3] = torch.tensor([1e4, -1e4, 0.0])  # saturates in e4m3
            ref.update(layer, k, v.transpose(1, 2), torch.tensor(pos, device="cuda"))
            scales = fused.layer_scales(layer)
            write_decode_kv(
                fused.k[layer], fused.v[layer], k, v.transpose(1, 2), torch.tensor(pos + 1, device="cuda"), *scales
            )
    assert torch.equal(ref.k.view(torch.uint8), fused.k.view(torch.uint8))
    assert torch.equal(ref.v.view(torch.uint8), fused.v.view(torch.uint8))
    assert fused.k.float().ne(0).sum() > 0.9 * 3 * 2 * 6 * 8 * 128


def test_fp32_master_autocast_graph():
    """FP32 weights + bf16 autocast (the GRPO trainer's setting) under a captured graph == eager."""
    model = tiny_qwen3(torch.float32)
    graphed = engine(model, cuda_graphs=True, compute_dtype=torch.bfloat16)
    eager = engine(model, cuda_graphs=False, static_decode=True, compute_dtype=torch.bfloat16)
    a = graphed.generate(prompts(), greedy=True)
    b = eager.generate(prompts(), greedy=True)
    assert torch.equal(a.input_ids, b.input_ids)
    with torch.no_grad():  # weights change in place: the next rollout (a new capture) sees them
        model.lm_head.weight.mul_(-1.0)
    c = graphed.generate(prompts(), greedy=True)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_capture_survives_a_dead_cycle_holding_an_older_graph():
    """A rollout's graphs close over the rollout (a reference cycle). Left to the cyclic collector, such a cycle
    can be freed in the middle of the next capture, destroying a graph while the stream captures, which invalidates
    that capture; `CapturedStep` collects first and keeps the collector off while it captures. The collector is
    made to run at nearly every allocation so that, without that, the old graph would die inside the capture."""
    import gc

    from nemo_jetrl.generation.native.cuda_graph import CapturedStep

    x = torch.arange(8, dtype=torch.float32, device="cuda")

    old = {"step": CapturedStep(lambda t: t * 2, (x.clone(),))}
    old["self"] = old  # a dead cycle once dropped: only the cyclic collector frees it (and its graph)
    assert torch.equal(old["step"](x), x * 2)
    del old
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        new = CapturedStep(lambda t: torch.stack([t + i for i in range(64)]).sum(0), (x.clone(),))
        out = new(x)  # captures with the collector eager to run
        torch.cuda.synchronize()
    finally:
        gc.set_threshold(*thresholds)
    assert gc.isenabled()
    assert torch.equal(out, 64 * x + sum(range(64)))
    assert torch.equal(new(x + 1), 64 * (x + 1) + sum(range(64)))  # the replay reads the new input


@pytest.mark.parametrize("top_p", [1.0, 0.9], ids=["fused", "nucleus"])
def test_sampling_with_an_int_draw_counter_never_waits_for_the_device(top_p):
    """The static rollout loop samples with the step as a Python int. Sent to the GPU as a tensor it was a blocking
    copy: every decode step waited for the device to drain, and the device then idled through the next graph
    launch. Under CUDA's sync check nothing in sampling may block, and the draws equal a device counter's."""
    from nemo_jetrl.generation.native.sampler import SamplingParams, sample, sequence_keys

    logits = torch.randn(8, 1000, device="cuda")
    keys = sequence_keys(3, torch.arange(8, device="cuda"))
    params = SamplingParams(temperature=0.8, top_p=top_p)
    want = sample(logits, params, keys=keys, counters=torch.full((8,), 2, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [sample(logits, params, keys=keys, counters=step) for step in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got[2][0], want[0]) and torch.equal(got[2][1], want[1])
    assert not torch.equal(got[0][0], got[1][0]) or not torch.equal(got[1][0], got[2][0])
