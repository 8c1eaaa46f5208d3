"""The native engine's prompt intake: checks, each row's response cap, and the left-padded [B, W] batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_prompts(prompt_ids: list[list[int]], max_total_length: int | None, vocab_size: int) -> None:
    """A clear error for an empty batch or prompt, a prompt that leaves no room for a response, or ids outside the
    vocabulary."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty")
    if max_total_length is not None and max(len(p) for p in prompt_ids) >= max_total_length:
        raise ValueError(
            f"a prompt leaves no room for a response within max_total_length / max_model_len={max_total_length}"
        )
    for i, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt_ids[{i}] is empty")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt_ids[{i}] has token ids outside [0, {vocab_size})")


def length_caps(
    prompt_ids: list[list[int]], max_new_tokens: int, max_total_length: int | None, requested: Sequence[int] | None
) -> list[int]:
    """Each row's response cap: max_new_tokens (or the row's requested cap, if lower), within max_total_length
    (and max_model_len)."""
    caps = [max_new_tokens] * len(prompt_ids)
    if requested is not None:
        if len(requested) != len(prompt_ids) or min(requested) < 1:
            raise ValueError(f"max_new_tokens must give one cap >= 1 per prompt, got {list(requested)[:8]}...")
        caps = [min(c, int(r)) for c, r in zip(caps, requested)]
    if max_total_length is None:
        return caps
    return [min(c, max_total_length - len(p)) for c, p in zip(caps, prompt_ids)]


def left_pad(
    prompt_ids: list[list[int]], width: int, pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, width] token ids and attention mask on `device`, prompts left-padded into columns [0, P)."""
    prompt_len = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, prompt in enumerate(prompt_ids):
        ids[row, prompt_len - len(prompt) : prompt_len] = torch.tensor(prompt, dtype=torch.long)
        mask[row, prompt_len - len(prompt) : prompt_len] = 1
    return ids.to(device), mask.to(device)
