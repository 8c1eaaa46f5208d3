"""Routing identity (models/moe_routing.py, policy/moe_step.py): the rollout records the experts each token takes, the
trainer's logprob forward compares its own; in the exact mode the two are the same bits (agreement 1.0, logprobs
equal), and the record is the same from every decode form and every trainer layout (padded, rotated, packed)."""

import pytest
import torch

from benchmarks.common import policy_config
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import ForwardPlan
from nemo_jetrl.models.moe_routing import RoutingRecord, observing, routing_agreement_counts, scored_positions
from nemo_jetrl.models.tiny import random_tiny_qwen3_moe
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe

PROMPTS = [[1, 5, 6, 7], [1, 3, 4], [1, 8, 9, 10, 11], [1, 2]]


def test_agreement_counts_sets_over_the_scored_tokens():
    response = torch.tensor([[0, 0, 1, 1, 0]])  # tokens 2, 3 generated: positions 1, 2 score them
    assert scored_positions(response).tolist() == [[False, True, True, False, False]]
    rollout = torch.tensor([[[0, 1], [2, 3]]] * 5, dtype=torch.uint8)[None]  # [1, 5, L=2, k=2]
    trainer = rollout.clone()
    trainer[0, 1, 0] = torch.tensor([1, 0])  # the same set in another order: equal
    trainer[0, 2, 1] = torch.tensor([2, 4])  # one expert differs: this (token, layer) disagrees
    trainer[0, 4] = 7  # an unscored token: not counted
    match, total = routing_agreement_counts(trainer, rollout, response)
    assert (int(match), int(total)) == (3, 4)


def _policy(mode: str, **policy) -> NativePolicy:
    gen = {"deterministic": mode == "exact", "matched_kernels": mode == "matched"}
    cfg = policy_config(master_dtype="float32", compute_dtype="float32", generation=gen, logprob_batch_size=3, **policy)
    model = random_tiny_qwen3_moe(0)
    return NativePolicy(cfg, PrecisionRecipe.preset("jetrl"), torch.device("cpu"), model=model)


def _rollout(policy: NativePolicy, **engine):
    eng = NativeGenerationEngine(policy.model, max_new_tokens=5, stop_token_ids=[], pad_token_id=0, **engine)
    return eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0))


def test_exact_mode_routing_and_logprobs_are_the_trainers_bit_for_bit():
    policy = _policy("exact")
    out = _rollout(policy)
    assert out.routed_experts.shape == (4, out.input_ids.shape[1], 2, 2) and out.routed_experts.dtype == torch.uint8
    batch = TrainBatch(out.input_ids, out.attention_mask, out.response_mask, torch.zeros(4), out.generation_logprobs,
                       generation_routing=out.routed_experts)  # fmt: skip
    logp = policy.get_logprobs(batch)
    scored = out.response_mask.bool()
    assert torch.equal(logp[scored], out.generation_logprobs[scored])
    assert policy.routing.pop_metrics() == {"routing_agreement": 1.0}
    # the rollout's record is what a full forward over the final tokens routes, for every token it ran
    record = RoutingRecord.for_model(policy.model, *out.input_ids.shape, "cpu")
    mask = out.attention_mask
    with torch.no_grad(), observing(policy.model, record):
        plan = ForwardPlan.trainer(policy.model, None, fused_train=False)  # the exact parts the model runs
        decoder_forward(policy.model, out.input_ids, position_ids_from_mask(mask), mask, plan)
    ran = mask.bool().clone()
    ran[:, -1] = False  # the last column's tokens were sampled, never run
    assert torch.equal(record.choices[ran], out.routed_experts[ran])


def test_static_decode_records_what_the_prefix_decode_records():
    policy = _policy("fast")
    prefix, static = _rollout(policy), _rollout(policy, static_decode=True)
    assert torch.equal(prefix.input_ids, static.input_ids)
    ran = prefix.attention_mask.bool().clone()
    ran[:, -1] = False
    assert torch.equal(prefix.routed_experts[ran], static.routed_experts[ran])
    assert prefix.routed_experts[ran].float().std() > 0  # more than one expert in use


@pytest.mark.parametrize("layout", [{"train_causal_attention": True}, {"sequence_packing": {"enabled": True}}])
def test_rotated_and_packed_trainer_layouts_compare_the_same_tokens(layout):
    padded = _policy("fast")
    out = _rollout(padded)
    batch = TrainBatch(out.input_ids, out.attention_mask, out.response_mask, torch.zeros(4), out.generation_logprobs,
                       generation_routing=out.routed_experts)  # fmt: skip
    padded.get_logprobs(batch)
    want = padded.routing.pop_metrics()["routing_agreement"]
    other = _policy("fast", **layout)
    assert other.kernels["causal_attention"] or other.kernels["pack_round"]
    other.get_logprobs(batch)
    assert want > 0.9 and other.routing.pop_metrics()["routing_agreement"] == pytest.approx(want, abs=0.05)
    flipped = TrainBatch(**{**batch.__dict__, "generation_routing": (out.routed_experts + 1) % 8})
    other.get_logprobs(flipped)  # every recorded expert moved: no (token, layer) agrees
    assert other.routing.pop_metrics() == {"routing_agreement": 0.0}
