"""The native engine's prompt intake (`generation/native/prompts.py`): each refusal names its cause, response caps
stay within the engine's limits, and the left-padded batch puts every prompt's last token in the same column."""

import pytest
import torch

from nemo_jetrl.generation.native.prompts import check_prompts, left_pad, length_caps


def test_bad_prompts_are_refused_by_cause():
    check_prompts([[1, 2], [3]], max_total_length=3, vocab_size=4)  # fits: no error
    for prompts, limit, match in (
        ([], None, "prompt_ids is empty"),
        ([[1], []], None, r"prompt_ids\[1\] is empty"),
        ([[1, 2, 3]], 3, "no room for a response within max_total_length / max_model_len=3"),
        ([[1, 4]], None, r"prompt_ids\[0\] has token ids outside \[0, 4\)"),
        ([[-1]], None, r"outside \[0, 4\)"),
    ):
        with pytest.raises(ValueError, match=match):
            check_prompts(prompts, max_total_length=limit, vocab_size=4)


def test_response_caps_respect_the_request_and_the_total_length():
    prompts = [[1] * 2, [1] * 5, [1] * 7]
    assert length_caps(prompts, 4, None, None) == [4, 4, 4]
    assert length_caps(prompts, 4, None, [9, 1, 3]) == [4, 1, 3]  # a request only lowers the cap
    assert length_caps(prompts, 4, 9, None) == [4, 4, 2]  # 7 prompt tokens leave 2 of 9
    with pytest.raises(ValueError, match="one cap >= 1 per prompt"):
        length_caps(prompts, 4, None, [1, 0, 1])
    with pytest.raises(ValueError, match="one cap >= 1 per prompt"):
        length_caps(prompts, 4, None, [1, 1])


def test_left_pad_aligns_the_prompts_ends():
    ids, mask = left_pad([[5, 6, 7], [8]], 5, pad_token_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7, 0, 0], [0, 0, 8, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [0, 0, 1, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long
