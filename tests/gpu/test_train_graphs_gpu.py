"""policy.train_cuda_graphs on CUDA: captured and replayed micro-batches give the eager trainer's steps bit for bit
(metrics, prev_logprobs from the training forward, master weights, FP8 weights), across shapes and a reset."""

import math

import pytest
import torch

from benchmarks.bench_train_step import make_batch
from benchmarks.common import LOSS, TINY, build_model, policy_config
from nemo_jetrl.policy.micro_batches import plan_micro_batches
from nemo_jetrl.policy.native import NativePolicy, NonFiniteError
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
OPT = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "betas": (0.9, 0.999), "eps": 1e-8}


def step_batch(step: int, seq: int = 128):
    batch = make_batch(4, seq, TINY["vocab_size"])
    batch.advantages = torch.linspace(-1.0, 1.0, 4) * (1 + step)
    batch.attention_mask[1, :40] = 0  # a left-padded row
    batch.response_mask[1, :41] = 0
    return batch


def run(preset: str, graphs: bool, from_forward: bool, causal: bool = False, seqs=(128, 128, 128, 96, 128), **recipe):
    model = build_model(TINY, None, DEV, torch.bfloat16).train()
    source = "train_forward" if from_forward else "logprob_forward"
    cfg = policy_config(
        optimizer=OPT, train_cuda_graphs=graphs, prev_logprobs_source=source, train_causal_attention=causal
    )
    policy = NativePolicy(cfg, PrecisionRecipe.preset(preset, **recipe), DEV, model=model)
    batches = [step_batch(step, seq) for step, seq in enumerate(seqs)]
    return policy, *take_steps(policy, batches, "forward" if from_forward else "given")


def take_steps(policy: NativePolicy, batches, prev: str):
    """Train + refit per batch -> (metrics, prev_logprobs) per step. prev: "given" (the batch's own),
    "forward" (from the training forward) or "pass" (the logprob pass)."""
    metrics, logps = [], []
    for batch in batches:
        if prev != "given":
            batch.prev_logprobs = None if prev == "forward" else policy.get_logprobs(batch)
        out = policy.train(batch, LOSS)
        out.pop("cuda_graph_replay_fraction", None)
        metrics.append(out)
        logps.append(batch.prev_logprobs)
        policy.prepare_refit()
    return metrics, logps


@pytest.mark.parametrize(
    "preset,from_forward,causal,recipe",
    [
        ("bf16", False, False, {}),
        ("jetrl", False, False, {}),
        ("jetrl", True, False, {}),
        ("jetrl", False, True, {}),
        ("jetrl", False, False, {"cache_dgrad_weight": True}),  # W^T held, re-made in place after each step
        ("rowwise", False, False, {}),  # the DGrad cast of W made inside each captured backward
        ("rowwise", False, False, {"cache_dgrad_weight": True}),  # ... or held, re-made in place after each step
        ("tensorwise", False, False, {"cache_dgrad_weight": True}),
    ],
)
def test_captured_steps_equal_eager_steps(preset, from_forward, causal, recipe):
    eager, m_eager, lp_eager = run(preset, False, from_forward, causal, **recipe)
    graphed, m_graph, lp_graph = run(preset, True, from_forward, causal, **recipe)
    g = graphed.train_graphs
    # micro-batches of [1, 128] in steps 0-2 and 4, [1, 96] in step 3: each shape's first runs eagerly, its
    # second is captured (and replayed), every later one replayed
    assert g.captures == 2 and g.resets == 0
    assert g.replays == 5 * 4 - 2
    for a, b in zip(m_eager, m_graph):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])), k
    for a, b in zip(lp_eager, lp_graph):
        assert torch.equal(a, b)
    for (name, p), q in zip(eager.model.named_parameters(), graphed.model.parameters()):
        assert torch.equal(p, q), name
    fp8 = [(a, b) for a, b in zip(eager.model.modules(), graphed.model.modules()) if isinstance(a, Fp8Linear)]
    assert (len(fp8) > 0) == (preset != "bf16")
    for a, b in fp8:
        qa, qb = a.quantized_weight(), b.quantized_weight()
        assert torch.equal(qa.data.view(torch.uint8), qb.data.view(torch.uint8)) and torch.equal(qa.scale, qb.scale)


def test_a_non_finite_step_drops_the_graphs_and_training_goes_on_equal_to_eager():
    policies = []
    for graphs in (False, True):
        model = build_model(TINY, None, DEV, torch.bfloat16).train()
        cfg = policy_config(optimizer=OPT, train_cuda_graphs=graphs)
        policy = NativePolicy(cfg, PrecisionRecipe.preset("jetrl"), DEV, model=model)
        for step in range(3):
            policy.train(step_batch(step), LOSS)
        bad = step_batch(3)
        bad.advantages[0] = float("nan")  # a non-finite loss: the step is skipped, its gradients dropped
        with pytest.raises(NonFiniteError):
            policy.train(bad, LOSS)
        for step in range(4, 7):
            out = policy.train(step_batch(step), LOSS)
        policies.append((policy, out))
    (eager, out_e), (graphed, out_g) = policies
    assert graphed.train_graphs.resets == 1 and out_g["cuda_graph_replay_fraction"] == 1.0
    out_g.pop("cuda_graph_replay_fraction")
    assert out_e == out_g
    for p, q in zip(eager.model.parameters(), graphed.model.parameters()):
        assert torch.equal(p, q)


def test_more_shapes_than_graphs_evict_the_oldest_and_a_reset_captures_again():
    """Every step a new width (as a GRPO run's padded lengths): past `max_graphs` the oldest graph goes, a reset
    drops them all with their memory pool, and captures go on (a capture into a pool no live graph holds is refused
    by CUDA's allocator: the bug the GPU CLI run met at its fifth step); every step equals the eager trainer's."""
    seqs = (128, 96, 64, 112, 128, 96, 80)
    runs = []
    for graphs in (False, True):
        model = build_model(TINY, None, DEV, torch.bfloat16).train()
        policy = NativePolicy(policy_config(optimizer=OPT, train_cuda_graphs=graphs), PrecisionRecipe.preset("jetrl"),
                              DEV, model=model)  # fmt: skip
        if graphs:
            policy.train_graphs.max_graphs = 2
        outs = []
        for step, seq in enumerate(seqs):
            if graphs and step == 5:
                policy.train_graphs.reset()
            out = policy.train(step_batch(step, seq), LOSS)
            out.pop("cuda_graph_replay_fraction", None)
            outs.append(out)
            policy.prepare_refit()
        runs.append((policy, outs))
    (eager, m_eager), (graphed, m_graph) = runs
    g = graphed.train_graphs
    # steps 2, 3, 4 evict 128, 96, 64; step 4's 128 was warmed at step 0 and is captured at once (no eager run);
    # the reset before step 5 forgets the warm-ups too. Each 4-micro-batch step: one eager run where the shape is
    # new to the graphs' warm-up set, and a capture (replayed at once) where it has no graph.
    assert g.evictions == 3 and g.resets == 1 and list(g.graphs) and len(g.graphs) == 2
    assert g.captures == 7 and g.replays == 7 * 4 - 6
    assert m_eager == m_graph
    for p, q in zip(eager.model.parameters(), graphed.model.parameters()):
        assert torch.equal(p, q)


def grpo_steps(preset: str, graphs: bool, calibration_pass: str, from_forward: bool, seqs=(128, 128, 96, 128)):
    """GRPO's trainer calls per step: logprob pass (unless prev_logprobs come from the training forward), train,
    refit (new KV scales); the first rollout's KV scales from a bootstrap calibration (as grpo.py does)."""
    model = build_model(TINY, None, DEV, torch.bfloat16).train()
    cfg = policy_config(
        optimizer=OPT, train_cuda_graphs=graphs, logprob_batch_size=2,
        prev_logprobs_source="train_forward" if from_forward else "logprob_forward",
        generation={"kv_cache_calibration_pass": calibration_pass},
    )  # fmt: skip
    policy = NativePolicy(cfg, PrecisionRecipe.preset(preset), DEV, model=model)
    g = policy.train_graphs
    if graphs:
        g.max_graphs = 8  # every shape of every pass keeps its graph
    if policy.kv_calibrator is not None:
        policy.calibrate_kv_scales(step_batch(0))
    logps, metrics, scales = [], [], []
    for step, seq in enumerate(seqs):
        counts = (g.captures, g.replays) if graphs else None
        batch = step_batch(step, seq)
        batch.prev_logprobs = None if from_forward else policy.get_logprobs(batch)
        out = policy.train(batch, LOSS)
        out.pop("cuda_graph_replay_fraction", None)
        metrics.append({**out, **policy.prepare_refit()})
        logps.append(batch.prev_logprobs)
        if policy.kv_scales is not None:
            scales.append(torch.stack([policy.kv_scales.q, policy.kv_scales.k, policy.kv_scales.v]).cpu())
    last_step = None if g is None else (g.captures - counts[0], g.replays - counts[1])
    return policy, metrics, logps, scales, last_step


@pytest.mark.parametrize(
    "preset,calibration_pass,from_forward",
    [("bf16", "fused", False), ("jetrl", "fused", False), ("jetrl_kv", "fused", False),
     ("jetrl_kv", "post_step", False), ("jetrl_kv", "fused", True)],
)  # fmt: skip
def test_captured_logprob_and_calibration_passes_equal_eager_ones(preset, calibration_pass, from_forward):
    """The logprob pass, the KV calibration forwards (fused into the logprob pass or the training forward, or the
    post-step pass) replay captured micro-batches: prev_logprobs, KV scales, metrics and weights equal eager's."""
    eager, m_eager, lp_eager, s_eager, _ = grpo_steps(preset, False, calibration_pass, from_forward)
    graphed, m_graph, lp_graph, s_graph, last_step = grpo_steps(preset, True, calibration_pass, from_forward)
    assert (len(s_eager) == 4) == (preset == "jetrl_kv") and len(s_graph) == len(s_eager)
    for a, b in zip(s_eager, s_graph):
        assert torch.equal(a, b)
    for a, b in zip(lp_eager, lp_graph):
        assert a.abs().sum() > 0 and torch.equal(a, b)
    assert m_eager == m_graph
    for (name, p), q in zip(eager.model.named_parameters(), graphed.model.parameters()):
        assert torch.equal(p, q), name
    # the last step's shapes ([1, 128] training and [2, 128] logprob / calibration micro-batches) were captured in
    # steps 0-1: every micro-batch of it is a replay (4 training, 2 logprob, 2 post-step calibration ones)
    micro_batches = (
        4 + (0 if from_forward else 2) + (2 if calibration_pass == "post_step" and preset == "jetrl_kv" else 0)
    )
    assert last_step == (0, micro_batches)


PACKED = {"enabled": True, "train_mb_tokens": 512, "logprob_mb_tokens": 768, "sequence_length_round": 16}


def packed_batch(step: int):
    """12 rows of 160 columns: prompts of 16-40 tokens left-padded to column 40, responses of 2-120 tokens."""
    gen = torch.Generator().manual_seed(step)
    batch = make_batch(12, 160, TINY["vocab_size"])
    prompt = torch.randint(16, 41, (12, 1), generator=gen)
    response = torch.exp(torch.randn(12, 1, generator=gen) + 3.5).round().clamp(2, 120).long()
    cols = torch.arange(160)[None]
    batch.attention_mask = ((cols >= 40 - prompt) & (cols < 40 + response)).long()
    batch.response_mask = ((cols >= 40) & (cols < 40 + response)).long()
    batch.generation_logprobs = -12.0 * batch.response_mask.float()
    batch.prev_logprobs = batch.generation_logprobs.clone()
    batch.advantages = torch.linspace(-1.0, 1.0, 12) * (1 + step)
    return batch


def packed_run(preset: str, graphs: bool, eager_layout: bool = False, steps: int = 4):
    """Packed GRPO trainer steps (logprob pass + train + refit). eager_layout: the captured trainer's fixed layout,
    run eagerly (every micro-batch through its function, none captured)."""
    model = build_model(TINY, None, DEV, torch.bfloat16).train()
    cfg = policy_config(optimizer=OPT, train_cuda_graphs=graphs, sequence_packing=PACKED, max_total_sequence_length=160)
    policy = NativePolicy(cfg, PrecisionRecipe.preset(preset), DEV, model=model)
    if eager_layout:
        def eager(key, host_mb, normalizer, fn, packing=None):
            norm = torch.full((), normalizer, dtype=torch.float32, device=DEV)
            return fn(host_mb.to(DEV), norm, None if packing is None else packing.to(DEV))

        policy.train_graphs.run = eager
    return policy, *take_steps(policy, [packed_batch(step) for step in range(steps)], "pass")


@pytest.mark.parametrize("preset", ["bf16", "jetrl"])
def test_captured_packed_steps_equal_their_layout_run_eagerly_and_track_the_packed_trainer(preset):
    """With sequence packing every bin replays one of a few fixed layouts (rows padded to a power of two >= 8, the
    packed row to eighths of the budget): bit for bit the same layout run eagerly; against the eager packed trainer
    (each bin packed to its own tokens) the logprobs of the first pass agree to GEMM-shape rounding."""
    graphed, m_graph, lp_graph = packed_run(preset, True)
    layout, m_layout, lp_layout = packed_run(preset, True, eager_layout=True)
    eager, m_eager, lp_eager = packed_run(preset, False)
    g = graphed.train_graphs
    calls = sum(len(plan_micro_batches(packed_batch(s).attention_mask, graphed.cfg, kind))
                for s in range(4) for kind in ("logprob", "train"))  # fmt: skip
    # each layout's first micro-batch runs eagerly, every later one replays (its second is captured first)
    assert len(g.warm) >= g.captures == len(g.graphs) >= 2 and g.resets == 0 and g.evictions == 0
    assert g.replays == calls - len(g.warm) and calls >= 12
    assert m_graph == m_layout
    for a, b in zip(lp_graph, lp_layout):
        assert torch.equal(a, b)
    for p, q in zip(graphed.model.parameters(), layout.model.parameters()):
        assert torch.equal(p, q)
    real = packed_batch(0).attention_mask.bool()
    assert torch.count_nonzero(lp_graph[0][~real]) == 0
    err = (lp_graph[0] - lp_eager[0]).abs().max()
    assert float(err) <= 0.05, float(err)  # bf16 logits of a 512-vocabulary random model
    for a, b in zip(m_graph, m_eager):
        assert a["num_micro_batches"] == b["num_micro_batches"] and a["num_valid_tokens"] == b["num_valid_tokens"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=0.05)
