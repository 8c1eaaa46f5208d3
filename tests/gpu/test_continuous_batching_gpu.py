"""Continuous batching on CUDA: per-row key counts in the decode kernels == reference, the per-row K/V write ==
`KVCache.update`, the paged decode attention (BF16 Triton, FP8 Triton, FP8 CUDA) == its twin, the paged K/V write
bitwise its twin, every CUDA-graph batch bucket == eager (with preemption too), sampling streams equal on CPU and
GPU.

Run on a GPU box: `PYTHONPATH=. python3 -m pytest tests/gpu/test_continuous_batching_gpu.py -q`.
"""

import pytest
import torch

from nemo_jetrl.generation.native.decode_attention import decode_attention, decode_attention_ref, write_decode_kv
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.generation.native.paged_kv_cache import paged_decode_attention_ref, paged_write_ref
from nemo_jetrl.generation.native.sampler import sequence_keys, uniforms
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.kv import kv_quant

from .test_cuda_graph_decode import engine, kv_scales, prompts, tiny_qwen3

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("fp8", "impl"), [(False, "triton"), (True, "triton"), (True, "cuda")], ids=["bf16", "fp8-triton", "fp8-cuda"]
)
def test_per_row_kv_len_matches_the_reference_row_by_row(fp8, impl):
    torch.manual_seed(0)
    B, H, Hk, S, D = 6, 32, 8, 700, 128
    q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
    valid = torch.rand(B, S, device="cuda") > 0.2
    valid[:, 0] = True
    ks = vs = None
    if fp8:
        ks, vs = (torch.tensor(3.0 / 448, device="cuda") for _ in range(2))
        k, v = kv_quant(k, ks), kv_quant(v, vs)
    lens = torch.tensor([1, 17, 700, 256, 333, 64], device="cuda")  # [B] keys per row
    for splits in (None, 1, 3):
        out = decode_attention(q, k, v, valid, lens, 0.088, ks, vs, num_splits=splits, impl=impl)
        for b, n in enumerate(lens.tolist()):
            ref = decode_attention_ref(q[b : b + 1], k[b : b + 1], v[b : b + 1], valid[b : b + 1], n, 0.088, ks, vs)
            err = (out[b].float() - ref[0].float()).norm() / ref.float().norm()
            assert err.item() < (2e-3 if fp8 else 1e-2), (splits, b, err.item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_per_row_kv_write_is_bitwise_the_cache_update(dtype):
    torch.manual_seed(0)
    ref, fused = (KVCache(1, 5, 8, 40, 128, dtype=dtype, device="cuda") for _ in range(2))
    if dtype != torch.bfloat16:
        for cache in (ref, fused):
            cache.set_scales(torch.tensor([0.02], device="cuda"), torch.tensor([0.03], device="cuda"))
    cols = torch.tensor([0, 39, 7, 7, 20], device="cuda")  # [B] each row's own column
    k = (3 * torch.randn(5, 8, 1, 128, device="cuda")).bfloat16()
    v = (3 * torch.randn(5, 8, 1, 128, device="cuda")).bfloat16()
    ref.update(0, k, v, cols)
    write_decode_kv(fused.k[0], fused.v[0], k, v, cols + 1, *fused.layer_scales(0))
    assert torch.equal(ref.k.view(torch.uint8), fused.k.view(torch.uint8))
    assert torch.equal(ref.v.view(torch.uint8), fused.v.view(torch.uint8))
    written = ref.k[0].float().ne(0).any(-1)  # [B, H_kv, S]
    assert written.sum() == 5 * 8 and all(written[b, :, c].all() for b, c in enumerate(cols.tolist()))


@pytest.mark.parametrize("variant", ["bf16", "fp8+kv"])
def test_captured_continuous_decode_equals_eager(variant):
    model = tiny_qwen3()
    kw = {"max_num_seqs": 5}
    if variant == "fp8+kv":
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
        kw["kv_cache_dtype"] = "fp8"
    graphed, eager = engine(model, cuda_graphs=True, **kw), engine(model, cuda_graphs=False, **kw)
    for eng in (graphed, eager):
        if variant == "fp8+kv":
            eng.update_weights(kv_scales=kv_scales())
    batch = prompts(12)
    a = graphed.generate(batch, generator=torch.Generator("cuda").manual_seed(5))
    b = eager.generate(batch, generator=torch.Generator("cuda").manual_seed(5))
    assert graphed.last_rollout_stats.num_rows == 5 and graphed.last_rollout_stats.admissions > 1
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.generation_logprobs, b.generation_logprobs)
    whole = engine(model, cuda_graphs=True, **({"kv_cache_dtype": "fp8"} if variant == "fp8+kv" else {}))
    if variant == "fp8+kv":
        whole.update_weights(kv_scales=kv_scales())
    c = whole.generate(batch, generator=torch.Generator("cuda").manual_seed(5))
    first = a.prompt_length  # every row's first sampled token comes from its own prefill
    assert torch.equal(a.input_ids[:, first], c.input_ids[:, first])
    same = (a.input_ids == c.input_ids).float().mean().item()
    print(f"{variant}: continuous vs static batch, tokens equal {same:.3f}")


def paged_case(fp8: bool, page: int = 16):
    """Pools of 90 pages, a table of 5 rows x 50 pages scattered over them, per-row key counts up to 800."""
    torch.manual_seed(0)
    blocks, H, Hk, D = 90, 32, 8, 128
    k = torch.randn(blocks, Hk, page, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(blocks, Hk, page, D, device="cuda", dtype=torch.bfloat16)
    ks = vs = None
    if fp8:
        ks, vs = (torch.tensor(3.0 / 448, device="cuda") for _ in range(2))
        k, v = kv_quant(k, ks), kv_quant(v, vs)
    table = (torch.randperm(5 * 50, device="cuda") % (blocks - 1) + 1).view(5, 50).to(torch.int32)  # [B, 50]
    q = torch.randn(5, H, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([1, 17, 800, 256, 333], device="cuda")  # [B] keys per row
    return q, k, v, table, lens, ks, vs


@pytest.mark.parametrize(
    ("fp8", "impl"), [(False, "triton"), (True, "triton"), (True, "cuda")], ids=["bf16", "fp8-triton", "fp8-cuda"]
)
def test_paged_decode_attention_matches_its_twin(fp8, impl):
    q, k, v, table, lens, ks, vs = paged_case(fp8)
    ref = paged_decode_attention_ref(q, k, v, table, lens, 0.088, ks, vs)  # [B, H, D]
    for splits in (None, 1, 3):
        out = decode_attention(q, k, v, None, lens, 0.088, ks, vs, block_table=table, num_splits=splits, impl=impl)
        for b in range(q.shape[0]):
            err = (out[b].float() - ref[b].float()).norm() / ref[b].float().norm()
            assert err.item() < (2e-3 if fp8 else 1e-2), (splits, b, err.item())


@pytest.mark.parametrize("config", [None, (4, 4), (4, 3), (8, 2)], ids=["default", "w4b4", "w4b3", "w8b2"])
def test_cuda_kernel_over_a_long_paged_cache_matches_its_twin(config):
    """A table 4,608 keys wide (`default_config` takes 3 CTAs/SM from 4,096 up), rows of 1 to 4,600 keys: every
    launch configuration and split count gives the twin's output within FP8's error, each row its own keys."""
    torch.manual_seed(0)
    blocks, H, Hk, D, page = 1200, 16, 8, 128, 16
    ks, vs = (torch.tensor(3.0 / 448, device="cuda") for _ in range(2))
    k = kv_quant(torch.randn(blocks, Hk, page, D, device="cuda", dtype=torch.bfloat16), ks)
    v = kv_quant(torch.randn(blocks, Hk, page, D, device="cuda", dtype=torch.bfloat16), vs)
    table = torch.randperm(blocks, device="cuda")[: 4 * 288].view(4, 288).to(torch.int32)  # [B, 288 pages]
    q = torch.randn(4, H, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([1, 2049, 4600, 3000], device="cuda")  # [B] keys per row
    ref = paged_decode_attention_ref(q, k, v, table, lens, 0.088, ks, vs)  # [B, H, D]
    for splits in (None, 1, 3, 5):
        out = decode_attention(
            q, k, v, None, lens, 0.088, ks, vs, block_table=table, num_splits=splits, impl="cuda", cuda_config=config
        )
        for b in range(q.shape[0]):
            err = (out[b].float() - ref[b].float()).norm() / ref[b].float().norm()
            assert err.item() < 2e-3, (config, splits, b, err.item())


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_paged_kv_write_is_bitwise_its_twin(fp8):
    _, k_pool, v_pool, table, _, ks, vs = paged_case(fp8)
    if fp8:
        ks, vs = torch.tensor(0.02, device="cuda"), torch.tensor(0.03, device="cuda")
    kr, vr = k_pool.clone(), v_pool.clone()
    k = (3 * torch.randn(5, 8, 1, 128, device="cuda")).bfloat16()
    v = (3 * torch.randn(5, 8, 1, 128, device="cuda")).bfloat16()
    lens = torch.tensor([1, 16, 17, 800, 333], device="cuda")
    write_decode_kv(k_pool, v_pool, k, v, lens, ks, vs, block_table=table)
    paged_write_ref(kr, vr, k, v, lens, table, ks, vs)
    assert torch.equal(k_pool.view(torch.uint8), kr.view(torch.uint8))
    assert torch.equal(v_pool.view(torch.uint8), vr.view(torch.uint8))


@pytest.mark.parametrize("variant", ["bf16", "fp8+kv"])
def test_every_cuda_graph_bucket_equals_eager_with_preemption(variant):
    model = tiny_qwen3()
    kw = {"max_num_seqs": 20, "sync_every": 4}
    if variant == "fp8+kv":
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
        kw["kv_cache_dtype"] = "fp8"
    token = KVCache.token_bytes(model, torch.float8_e4m3fn if variant == "fp8+kv" else torch.bfloat16)
    graphed, eager = engine(model, cuda_graphs=True, **kw), engine(model, cuda_graphs=False, **kw)
    tight = engine(model, cuda_graphs=True, kv_cache_memory_bytes=40 * 16 * token, sync_every=4, **(
        {"kv_cache_dtype": "fp8"} if variant == "fp8+kv" else {}))  # fmt: skip
    for eng in (graphed, eager, tight):
        if variant == "fp8+kv":
            eng.update_weights(kv_scales=kv_scales())
    batch = prompts(48)
    a = graphed.generate(batch, generator=torch.Generator("cuda").manual_seed(5))
    b = eager.generate(batch, generator=torch.Generator("cuda").manual_seed(5))
    buckets = graphed.last_rollout_stats.bucket_steps
    assert 20 in buckets and min(buckets) < 20, buckets  # the drain ran smaller graphs
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.generation_logprobs, b.generation_logprobs)
    c = tight.generate(batch, generator=torch.Generator("cuda").manual_seed(5))
    stats = tight.last_rollout_stats
    same = (a.input_ids == c.input_ids).float().mean().item()
    print(f"{variant}: buckets {buckets}; 39 blocks: {stats.preemptions} preemptions, tokens equal {same:.4f}")
    assert stats.preemptions > 0 and stats.peak_blocks_used <= 39
    first = a.prompt_length  # every row's first sampled token comes from its own prefill, in another batch here:
    agree = (a.input_ids[:, first] == c.input_ids[:, first]).float().mean().item()
    # GPU prefill is not batch-invariant (BF16: equal; FP8 GEMMs: 43 of 48 equal measured once on an H100)
    assert agree == 1.0 if variant == "bf16" else agree >= 0.85, agree


def test_sampling_streams_are_equal_on_cpu_and_gpu():
    keys = sequence_keys(1234, torch.arange(4096))
    counters = torch.arange(4096) % 97
    cpu = uniforms(keys, counters)
    gpu = uniforms(keys.cuda(), counters.cuda())
    assert torch.equal(cpu, gpu.cpu()) and 0 <= float(cpu.min()) and float(cpu.max()) < 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_sampler_matches_the_twin_and_the_fused_logprob(temperature):
    from nemo_jetrl.generation.native.sample_kernel import sample_fused
    from nemo_jetrl.generation.native.sampler import SamplingParams, sample
    from nemo_jetrl.models.logprobs import token_logprobs

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(256, 151936, generator=g) * 3).to(torch.bfloat16).cuda()  # [B, V] Qwen3 vocabulary
    keys = sequence_keys(7, torch.arange(256)).cuda()
    tokens, logp = sample(logits, SamplingParams(temperature=temperature), keys=keys, counters=3)  # fused on CUDA
    u = uniforms(keys, 3)
    assert torch.equal(tokens, sample_fused(logits, u, temperature)[0])
    twin, _ = sample(logits.cpu(), SamplingParams(temperature=temperature), keys=keys.cpu(), counters=3)
    agree = (tokens.cpu() == twin).float().mean().item()
    assert agree >= 255 / 256, agree  # different float64 summation orders: a boundary case at most, in a draw
    assert torch.equal(logp, token_logprobs(logits, tokens, temperature))  # bitwise the fused logprob kernel
    # the rows are independent: a row's draw does not depend on the batch around it
    sub_tokens, sub_logp = sample(logits[100:140], SamplingParams(temperature=temperature), keys=keys[100:140], counters=3)
    assert torch.equal(sub_tokens, tokens[100:140]) and torch.equal(sub_logp, logp[100:140])
