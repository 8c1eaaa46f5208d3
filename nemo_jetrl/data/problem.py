"""`Problem`: one prompt and its reference answer, the unit every task hands the GRPO loop (environments/ and the
dataset task alike, so it sits below both)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One prompt (plain text; the tokenizer adds <bos>) and its reference answer (plain text)."""

    prompt: str
    answer: str
