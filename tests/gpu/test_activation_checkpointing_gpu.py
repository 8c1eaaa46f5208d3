"""policy.dtensor_cfg.activation_checkpointing on CUDA (fused train kernels, grouped FP8 GEMMs, flash varlen
attention when packed, captured micro-batches): the trainer's steps are bit for bit those without it (metrics,
prev_logprobs, KV scales, master and FP8 weights), and a long micro-batch's training peak drops."""

import sys
from pathlib import Path

import pytest
import torch

from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe, fp8_layers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_train_step import make_batch  # noqa: E402
from common import LOSS, TINY, build_model, policy_config  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
OPT = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "betas": (0.9, 0.999), "eps": 1e-8}
PACKED = {"enabled": True, "train_mb_tokens": 256, "logprob_mb_tokens": 512, "sequence_length_round": 16}


def step_batch(step: int, rows: int = 4, seq: int = 128):
    batch = make_batch(rows, seq, TINY["vocab_size"])
    batch.advantages = torch.linspace(-1.0, 1.0, rows) * (1 + step)
    batch.attention_mask[1, :40] = 0  # a left-padded row
    batch.response_mask[1, :41] = 0
    batch.attention_mask[2, 100:] = 0  # a short response
    batch.response_mask[2, 100:] = 0
    return batch


def steps(
    preset: str,
    checkpointing: bool,
    graphs: bool,
    packed: bool,
    from_forward: bool,
    n: int = 4,
    transient: bool = False,
):
    """`n` GRPO trainer steps (logprob pass or prev_logprobs from the training forward, train, refit);
    `transient`: fp8_cfg.transient_train_weights."""
    model = build_model(TINY, None, DEV, torch.bfloat16).train()
    cfg = policy_config(
        optimizer=OPT, train_cuda_graphs=graphs, logprob_batch_size=2, max_total_sequence_length=128,
        prev_logprobs_source="train_forward" if from_forward else "logprob_forward",
        sequence_packing=PACKED if packed else {}, dtensor_cfg={"tensor_parallel_size": 1,
                                                                  "activation_checkpointing": checkpointing},
        fp8_cfg={"transient_train_weights": transient},
    )  # fmt: skip
    policy = NativePolicy(cfg, PrecisionRecipe.preset(preset), DEV, model=model)
    if policy.kv_calibrator is not None:
        policy.calibrate_kv_scales(step_batch(0))
    out = []
    for step in range(n):
        batch = step_batch(step)
        batch.prev_logprobs = None if from_forward else policy.get_logprobs(batch)
        metrics = policy.train(batch, LOSS)
        metrics.pop("cuda_graph_replay_fraction", None)
        metrics.update(policy.prepare_refit())
        out.append((metrics, batch.prev_logprobs))
    return policy, out


@pytest.mark.parametrize(
    "preset,graphs,packed,from_forward",
    [("bf16", False, False, False), ("jetrl", False, False, False), ("jetrl", True, False, False),
     ("jetrl_kv", True, False, True), ("jetrl", False, True, False), ("jetrl_kv", True, True, False)],
)  # fmt: skip
def test_checkpointed_steps_equal_plain_steps(preset, graphs, packed, from_forward):
    plain, out_plain = steps(preset, False, graphs, packed, from_forward)
    ckpt, out_ckpt = steps(preset, True, graphs, packed, from_forward)
    assert ckpt.kernels["activation_checkpointing"] and not plain.kernels["activation_checkpointing"]
    assert_same_steps(plain, out_plain, ckpt, out_ckpt, graphs)


@pytest.mark.parametrize("preset,packed", [("jetrl", False), ("jetrl_kv", True)])
def test_transient_fp8_weights_equal_cached_steps(preset, packed):
    """fp8_cfg.transient_train_weights (eager, checkpointed): each FP8 weight quantized as its layer runs and released
    after it; the steps are bit for bit the plain steps' (fused kernels, flash varlen when packed)."""
    plain, out_plain = steps(preset, False, False, packed, False)
    transient, out_transient = steps(preset, True, False, packed, False, transient=True)
    switched = {m.transient_weight for _, m in fp8_layers(transient.model)}
    assert switched == {True} and {m.transient_weight for _, m in fp8_layers(plain.model)} == {False}
    assert_same_steps(plain, out_plain, transient, out_transient, graphs=False)


def assert_same_steps(plain, out_plain, ckpt, out_ckpt, graphs: bool) -> None:
    """Metrics, prev_logprobs, master weights, FP8 bits and KV scales of two policies' steps are bitwise equal."""
    if graphs:  # the checkpointed micro-batches were captured and replayed too
        assert ckpt.train_graphs.captures >= 1 and ckpt.train_graphs.replays >= 4
    for (m_p, lp_p), (m_c, lp_c) in zip(out_plain, out_ckpt):
        assert m_p == m_c and m_p["grad_norm"] > 0
        assert lp_p.abs().sum() > 0 and torch.equal(lp_p, lp_c)
    for (name, p), q in zip(plain.model.named_parameters(), ckpt.model.parameters()):
        assert torch.equal(p, q), name
    for (name, a), (_, b) in zip(fp8_layers(plain.model), fp8_layers(ckpt.model)):
        qa, qb = a.quantized_weight(), b.quantized_weight()
        assert torch.equal(qa.data.view(torch.uint8), qb.data.view(torch.uint8)), name
        assert torch.equal(qa.scale, qb.scale), name
    if plain.kv_scales is not None:
        for part in ("q", "k", "v"):
            assert torch.equal(getattr(plain.kv_scales, part), getattr(ckpt.kv_scales, part))


@pytest.mark.parametrize("preset", ["bf16", "jetrl"])
def test_checkpointing_cuts_a_long_micro_batchs_training_peak(preset):
    """One 2 x 4,096-token micro-batch through 8 layers: the training phase's peak above the resident state falls
    below half (per layer only its [T, H] residual input stays, and the logits are recomputed per chunk)."""
    peaks = {}
    for checkpointing in (False, True):
        shape = {**TINY, "num_hidden_layers": 8}
        model = build_model(shape, None, DEV, torch.bfloat16).train()
        cfg = policy_config(optimizer=OPT, max_total_sequence_length=4096, train_micro_batch_size=2,
                            dtensor_cfg={"tensor_parallel_size": 1, "activation_checkpointing": checkpointing})  # fmt: skip
        policy = NativePolicy(cfg, PrecisionRecipe.preset(preset), DEV, model=model)
        batch = make_batch(2, 4096, TINY["vocab_size"])
        batch.prev_logprobs = batch.generation_logprobs.clone()
        policy.train(batch, LOSS)  # warm-up: gradients and optimizer state exist from here on
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        policy.train(batch, LOSS)
        peaks[checkpointing] = torch.cuda.max_memory_allocated() - resident
        del policy, model
        torch.cuda.empty_cache()
    assert peaks[True] < 0.5 * peaks[False], peaks


def test_the_step_timer_records_each_phases_allocated_peak():
    """Timer(memory_device=cuda) (the GRPO loop's): a phase's peak is what was allocated at most while it ran,
    nested phases included, and an enclosing phase's is the largest of its parts."""
    from nemo_jetrl.utils.timers import Timer

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    timer = Timer(memory_device=DEV)
    with timer.time("total_step_time"):
        with timer.time("generation"):
            big = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)  # 256 MiB
            del big
        with timer.time("training"):
            small = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
            del small
    gib = {k: v * 1024**3 - base for k, v in timer.get_memory_metrics().items()}
    assert gib["memory/generation_peak_gib"] == pytest.approx(256 << 20, abs=4 << 20)
    assert gib["memory/training_peak_gib"] == pytest.approx(64 << 20, abs=4 << 20)
    assert gib["memory/total_step_time_peak_gib"] == pytest.approx(256 << 20, abs=4 << 20)
    for phase in ("generation", "training", "total_step_time"):  # the footprint holds what was allocated
        assert gib[f"memory/{phase}_reserved_peak_gib"] >= gib[f"memory/{phase}_peak_gib"]


def test_graph_pool_free_bytes_count_a_live_captures_temporaries():
    """A captured graph's temporary (64 MiB, freed inside the capture) stays in its private pool: reserved, not
    allocated, counted by graph_pool_free_bytes while the graph lives; gone once the graph is and the cache released."""
    from nemo_jetrl.utils.device_memory import graph_pool_free_bytes, release_cached_memory

    release_cached_memory(DEV)
    before = graph_pool_free_bytes(DEV)
    x = torch.ones(1024, device=DEV)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # its own capture stream and private pool
        tmp = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
        tmp.fill_(1)
        y = x * tmp[:1].float()  # [1024]
        del tmp
    graph.replay()
    torch.cuda.synchronize()
    held = graph_pool_free_bytes(DEV) - before
    assert held >= 64 << 20, held
    assert float(y[0]) == 1.0
    del graph, y
    release_cached_memory(DEV)
    assert graph_pool_free_bytes(DEV) - before < 64 << 20


def test_released_cached_blocks_leave_the_footprint():
    """A freed 256 MiB buffer stays reserved (cached) until release_cached_memory gives it back to the driver."""
    from nemo_jetrl.utils.device_memory import release_cached_memory

    release_cached_memory(DEV)
    before = torch.cuda.memory_reserved(DEV)
    big = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    del big
    assert torch.cuda.memory_reserved(DEV) >= before + (256 << 20)
    assert release_cached_memory(DEV) and torch.cuda.memory_reserved(DEV) <= before
