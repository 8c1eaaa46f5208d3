"""DAPO: overlong reward shaping (hand values), dynamic sampling keeps whole groups paired with their rewards."""

from __future__ import annotations

import pytest
import torch

from nemo_jetrl.algorithms.config import RewardShapingConfig
from nemo_jetrl.algorithms.dapo import Rollout, dynamic_sampling, overlong_filter, shape_rewards
from nemo_jetrl.generation.interfaces import GenerationOutput

G = 3
SHAPING = RewardShapingConfig(
    enabled=True, overlong_buffer_length=4, overlong_buffer_penalty=0.5, max_response_length=10
)


def test_overlong_penalty_ramps_over_the_buffer():
    # expected length 10 - 4 = 6: L = 5, 6 -> 0; L = 8 -> -(2 / 4) * 0.5 = -0.25; L = 10 -> -0.5; L = 12 -> -0.75
    lengths = torch.tensor([5, 6, 8, 10, 12])
    shaped = shape_rewards(torch.ones(5), lengths, torch.ones(5, dtype=torch.bool), SHAPING)
    assert shaped.tolist() == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.25], abs=1e-7)
    off = SHAPING.model_copy(update={"enabled": False})
    assert shape_rewards(torch.ones(5), lengths, torch.ones(5), off).tolist() == [1.0] * 5
    coef = SHAPING.model_copy(update={"stop_properly_penalty_coef": 0.2})
    finished = torch.tensor([True, False, True, False, True])
    assert shape_rewards(torch.ones(5), lengths, finished, coef).tolist() == pytest.approx([1, 0.2, 1, 0.2, 1])


def test_overlong_filter_clears_truncated_rows_only():
    mask = torch.ones(3, 4, dtype=torch.long)
    got = overlong_filter(mask, torch.tensor([True, False, True]))
    assert got.tolist() == [[1] * 4, [0] * 4, [1] * 4]


def _scripted(
    prompt_ids: list[int],
    varied: set[int],
    width: int = 2,
    step: float = 0.1,
    shaped: torch.Tensor | None = None,
) -> Rollout:
    """Rows [prompt p, sample j] (p in input_ids, j in the response column); raw reward = p + j * step for varied
    prompts, p for constant ones; shaped reward = raw + 100 unless `shaped` [rows] is given; prompt width `width`
    (left padding differs)."""
    rows = [(p, j) for p in prompt_ids for j in range(G)]
    ids = torch.tensor([[0] * (width - 1) + [p, 50 + j] for p, j in rows])
    raw = torch.tensor([p + (j * step if p in varied else 0.0) for p, j in rows])
    n = len(rows)
    out = GenerationOutput(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        response_mask=torch.cat([torch.zeros(n, width), torch.ones(n, 1)], 1).long(),
        generation_logprobs=torch.zeros(ids.shape),
        prompt_length=width,
        response_lengths=torch.ones(n, dtype=torch.long),
        finished=torch.ones(n, dtype=torch.bool),
    )
    return Rollout(out, raw + 100 if shaped is None else shaped, raw)


def test_dynamic_sampling_keeps_whole_groups_with_their_own_rewards():
    batches = iter(
        [
            _scripted([1, 2, 3, 4], varied={2}),  # one varying group
            _scripted([5, 6, 7, 8], varied={5, 8}, width=3),  # two more (wider prompts: re-padded on merge)
            _scripted([9, 10, 11, 12], varied={9, 10, 11}),  # three more: 6 >= 4, surplus 2 groups discarded
            _scripted([13, 14, 15, 16], varied={13}),  # never drawn
        ]
    )
    train, generated, metrics = dynamic_sampling(lambda: next(batches), 4, G, 10, pad_token_id=0)
    assert len(generated) == 3 and metrics["dynamic_sampling_num_gen_batches"] == 3.0
    assert metrics["dynamic_sampling_num_discarded_valid_samples"] == 2.0 * G
    out = train.out
    prompts = out.input_ids[:, out.prompt_length - 1]  # last prompt column: the prompt id
    samples = out.input_ids[:, out.prompt_length] - 50  # first response column: the sample index
    assert prompts.tolist() == [2, 2, 2, 5, 5, 5, 8, 8, 8, 9, 9, 9]
    assert samples.tolist() == [0, 1, 2] * 4
    expected_raw = prompts.float() + samples.float() / 10
    torch.testing.assert_close(train.raw_rewards, expected_raw)
    torch.testing.assert_close(train.rewards, expected_raw + 100)
    assert out.response_mask[:, out.prompt_length].tolist() == [1] * 12 and out.response_mask.sum() == 12


def test_dynamic_sampling_gives_up_after_max_gen_batches():
    batches = iter([_scripted([1, 2], varied={1}), _scripted([3, 4], varied=set())])
    with pytest.raises(ValueError, match=r"1 of the 2 groups .* grpo.dynamic_sampling_max_gen_batches=2 "):
        dynamic_sampling(lambda: next(batches), 2, G, 2, pad_token_id=0)


def test_dynamic_sampling_filters_on_the_raw_rewards_not_the_shaped_ones():
    """Overlong shaping (expected length 6, -1/8 per token beyond) flattens one group and spreads another: prompt 1
    (raw 1, 1.125, 1.25 at lengths 6, 7, 8) shapes to 1, 1, 1; prompt 2 (raw 2, 2, 2 at the same lengths) to 2,
    1.875, 1.75. Filtering on the raw rewards keeps 1 and 3; on the shaped ones it would keep 2 and 3."""
    raw = torch.tensor([1.0, 1.125, 1.25, 2.0, 2.0, 2.0, 3.0, 3.125, 3.25])
    lengths = torch.tensor([6, 7, 8, 6, 7, 8, 6, 6, 6])
    cfg = SHAPING.model_copy(update={"overlong_buffer_penalty": 0.5})  # -(L - 6) / 4 * 0.5 = -(L - 6) / 8
    shaped = shape_rewards(raw, lengths, torch.ones(9, dtype=torch.bool), cfg)
    assert shaped.tolist() == [1.0, 1.0, 1.0, 2.0, 1.875, 1.75, 3.0, 3.125, 3.25]  # the premise, exactly
    first = _scripted([1, 2, 3], varied={1, 3}, step=0.125, shaped=shaped)
    assert torch.equal(first.raw_rewards, raw)
    batches = iter([first, _scripted([4, 5, 6], varied={4, 5, 6})])
    train, generated, metrics = dynamic_sampling(lambda: next(batches), 2, G, 10, pad_token_id=0)
    prompts = train.out.input_ids[:, train.out.prompt_length - 1]
    assert prompts.tolist() == [1, 1, 1, 3, 3, 3]
    assert len(generated) == 1 and metrics == {
        "dynamic_sampling_num_gen_batches": 1.0,
        "dynamic_sampling_num_discarded_valid_samples": 0.0,
    }
    torch.testing.assert_close(train.rewards, shaped[[0, 1, 2, 6, 7, 8]])  # the shaped ones train
