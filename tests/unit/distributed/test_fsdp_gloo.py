"""The sharded trainer on 2 CPU ranks (gloo; `NativePolicy` on the "fsdp" plan, built by the Ray worker's body) vs
the one-process trainer: same logprobs, same step, FP8 refit bits == trainer's.

The 2 ranks run `fsdp_rank_check.py` with torchrun's environment, forked from one interpreter that imported torch
once (jetrl_testkit/forkrun.py; no Ray here). Bitwise: logprobs, every metric of the step (the grad norm too:
float64 sums rounded once), the FP8 refit bits. The gradient is reduce-scattered after each micro-batch as FSDP2
does (3 micro-batches: (g0 + g2) + g1 against the one process's (g0 + g1) + g2), so master weights after the step
agree to 1e-6 absolute (an ulp) and an ulp may flip one FP8 tile.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from jetrl_testkit.forkrun import run_ranks
from jetrl_testkit.live_bytes import StepBytes

from nemo_jetrl.algorithms.grpo import setup
from nemo_jetrl.config import load_config
from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.worker import worker_setup_payload
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.precision import Fp8Linear, weight_quant
from nemo_jetrl.schema import validate_config

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parents[2] / "examples" / "configs" / "grpo_tiny.yaml"
ROWS = 40  # chunks of 16: [0,16) [16,32) [32,40) -> rank 0 runs two, rank 1 one + a dummy step


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    overrides = [
        f"logger.log_dir={tmp / 'logs'}",
        "logger.tensorboard_enabled=false",
        "grpo.num_prompts_per_step=8",
        "policy.train_micro_batch_size=16",
        "policy.logprob_batch_size=16",
        "policy.generation.kv_cache_dtype=auto",  # FSDP + weight refit here; FP8 KV: tests/functional
        "policy.fp8_cfg.train_kv_fake_quant=false",
        "cluster.num_cpu_threads=1",
    ]
    cfg = validate_config(load_config(CONFIG, overrides))
    run = setup(cfg)
    tok, policy = run.policy.tokenizer, run.policy
    problems = run.task.train_batch(0, 5)
    prompts = [tok(p.prompt)["input_ids"] for p in problems for _ in range(8)]
    out = run.engine.generate(prompts, generator=torch.Generator().manual_seed(3))
    adv = torch.randn(ROWS, generator=torch.Generator().manual_seed(4))
    batch = TrainBatch(out.input_ids, out.attention_mask, out.response_mask, adv, out.generation_logprobs.float())
    # what a Ray worker is handed (the process boundary: plain dicts, validated back there)
    spec = ClusterSpec.from_config(cfg.cluster)
    ref = {"setup": worker_setup_payload(cfg.policy, spec, cfg.grpo.seed), "batch": batch}
    ref["loss_fn"] = cfg.loss_fn.model_dump()
    bits0 = {n: policy.model.get_submodule(n).quantized_weight() for n in _fp8_names(policy.model)}
    ref["logprobs"] = policy.get_logprobs(batch)
    batch.prev_logprobs = ref["logprobs"]
    mask = batch.response_mask.float()
    ref["normalizer"] = float(mask.sum())
    with StepBytes(policy.model) as probe:  # what the micro-batches hold at each logits chunk
        metrics = policy.train(batch, run.loss_fn)
    ref["step_bytes"] = probe.samples
    policy.prepare_refit()
    bits1 = {n: policy.model.get_submodule(n).quantized_weight() for n in _fp8_names(policy.model)}
    ref["state_step1"] = policy.state_dict()
    ref["logprobs_step1"] = policy.get_logprobs(batch)
    batch.prev_logprobs = None
    torch.save(ref, tmp / "reference.pt")
    proc = run_ranks(HERE / "fsdp_rank_check.py", 2, str(tmp / "reference.pt"), str(tmp), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return {"ref": ref, "metrics": metrics, "bits0": bits0, "bits1": bits1, "ranks": ranks}


def _fp8_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, Fp8Linear) and m.rollout_fp8]


def _same_bits(replica_bits: dict, trainer_bits: dict) -> int:
    """How many FP8 weights differ (bits or scales) between the refit replica and the trainer's cache."""
    assert replica_bits.keys() == trainer_bits.keys() and len(trainer_bits) == 28
    return sum(
        not (torch.equal(d, q.data.view(torch.uint8)) and torch.equal(s, q.scale))
        for (d, s), q in ((replica_bits[n], trainer_bits[n]) for n in trainer_bits)
    )


def test_setup_refit_gives_the_trainers_fp8_bits_at_half_the_bytes(observed):
    for rank in observed["ranks"]:
        assert _same_bits(rank["bits_setup"], observed["bits0"]) == 0
        stats = rank["setup_refit"]
        # bytes the refits and FSDP2 assembled since the trainer started, set-up not counted: none
        assert stats["allgather_bytes"] == stats["fsdp_allgather_bytes"] == 0
        assert stats["num_fp8_weights"] == 28 and stats["fallback_weights"] == 0
        # 1 byte per weight + 4 bytes per 128x128 tile, vs 2 bytes per weight
        assert stats["fp8_vs_bf16_bytes"] == 0.5 + 4 / (2 * 128 * 128)
        assert stats["fp8_weight_bytes"] == 3_146_496 and stats["bf16_weight_bytes"] == 6_291_456


def test_logprobs_are_bitwise_those_of_the_single_process_trainer(observed):
    for rank in observed["ranks"]:  # every rank returns the whole batch's logprobs
        assert torch.equal(rank["logprobs"], observed["ref"]["logprobs"])
    (status, logp, mirror), (status1, none, no_mirror) = (r["worker_call"] for r in observed["ranks"])
    assert status == status1 == "ok" and torch.equal(logp, observed["ref"]["logprobs"])  # the Ray driver's view
    assert mirror == {"step": 0, "kv_scales": None} and none is None and no_mirror is None


def test_train_step_matches_single_process(observed):
    ranks, single = observed["ranks"], observed["metrics"]
    assert single["num_micro_batches"] == 3.0
    for r in ranks:
        assert r["train"] == single  # every metric bitwise, grad_norm included
    state, ref_state = ranks[0]["state"], observed["ref"]["state_step1"]
    assert ranks[1]["state"] == {"step": 1}  # only rank 0 keeps the full state
    assert state["model"].keys() == ref_state["model"].keys() and state["step"] == 1
    for name, value in ref_state["model"].items():
        torch.testing.assert_close(state["model"][name], value, rtol=0, atol=1e-6, msg=name)
    for i, s in ref_state["optimizer"]["state"].items():
        torch.testing.assert_close(state["optimizer"]["state"][i]["exp_avg"], s["exp_avg"], rtol=0, atol=1e-8)


def test_refit_after_the_step_matches_the_trainers_new_fp8_bits(observed):
    for rank in observed["ranks"]:
        assert _same_bits(rank["bits_step1"], observed["bits1"]) <= 1  # an ulp in the master may flip one tile
        assert _same_bits(rank["bits_after_load"], observed["bits1"]) == 0  # same master -> same bits, exactly


def test_loading_a_single_process_checkpoint_restores_its_logprobs(observed):
    for rank in observed["ranks"]:
        assert torch.equal(rank["logprobs_after_load"], observed["ref"]["logprobs_step1"])


def test_bf16_baseline_refit_moves_twice_the_bytes(observed):
    for rank in observed["ranks"]:
        bf16, fp8 = rank["bf16_refit"], rank["fp8_refit"]
        assert bf16["fp8_weight_bytes"] == bf16["bf16_weight_bytes"] == 6_291_456
        assert fp8["fp8_weight_bytes"] / bf16["fp8_weight_bytes"] == pytest.approx(0.50012207, abs=1e-8)
        assert fp8["seconds"] > 0 and bf16["seconds"] > 0


def test_untiled_shards_fall_back_to_gathering_the_master(observed):
    for rank in observed["ranks"]:
        assert rank["toy"] == {"fallback": 1, "equal": True}


def test_small_buckets_gather_the_trainers_bits_and_tensors(observed):
    """Several all-gathers (SMALL_BUCKET in fsdp_rank_check) assemble the same FP8 bits and BF16/FP32 tensors as
    the trainer's full weights (the single-process state the ranks loaded), bit for bit."""
    state = observed["ref"]["state_step1"]["model"]
    for rank in observed["ranks"]:
        small = rank["small_bucket"]
        assert len(small["sizes"]) >= 4, small["sizes"]
        assert _same_bits(small["bits"], observed["bits1"]) == 0
        assert small["other"].keys() and all(torch.equal(v, state[n]) for n, v in small["other"].items())


def test_bf16_refit_quantizes_the_full_bf16_master(observed):
    """The BF16 baseline ships the master in BF16 and quantizes it on the rollout side: the replica's bits are
    weight_quant(full master -> bf16), computed here from the single-process state."""
    state = observed["ref"]["state_step1"]["model"]
    for rank in observed["ranks"]:
        got = rank["bits_bf16_refit"]
        assert len(got) == 28
        for name, (data, scale) in got.items():
            want_data, want_scale = weight_quant(state[f"{name}.weight"].to(torch.bfloat16))
            assert torch.equal(data, want_data.view(torch.uint8)) and torch.equal(scale, want_scale), name


def test_a_step_gathers_the_fp8_bits_once(observed):
    """The step's all-gathers: the refit's FP8 bits + scales and FP32 rest once, plus FSDP2's gathers of the root
    (embeddings, norms) in the forwards; no FP8 linear's master is gathered in any forward."""
    for rank in observed["ranks"]:
        stats = rank["refit"]
        assert (
            stats["allgather_bytes"] == stats["fsdp_allgather_bytes"] + stats["fp8_weight_bytes"] + stats["other_bytes"]
        )
        assert 0 < stats["fsdp_allgather_bytes"] <= 4 * stats["other_bytes"]  # the root only, a few times


def test_a_rank_holds_no_more_per_micro_batch_than_the_one_process(observed):
    """At every logits chunk of the training forward (a micro-batch's activations all alive), what the step made and
    still holds besides the parameters and their gradients (activations, FSDP2's gathered units, the FP8 linears' whole-weight
    gradients before their reduce-scatter, and the like): a rank of 2 running the one process's 16-row micro-batches
    holds at most what the one process holds (+5%, allocator-free byte counts), so nothing per micro-batch piles
    up on a rank (the measured 2-GPU excess was the token budget: test_memory_preflight.py)."""
    one = max(observed["ref"]["step_bytes"])
    assert len(observed["ref"]["step_bytes"]) == 3 and one > 0  # one chunk per micro-batch (16, 16, 8 rows)
    for rank in observed["ranks"]:
        samples = rank["step_bytes"]
        assert len(samples) == 2  # two forwards on each rank (rank 1: one and a dummy)
        assert max(samples) <= 1.05 * one, (samples, one)
