"""One response judged with math-verify (math_env.py's rules), torch-free: the verifier process imports this module
and runs `judge` there (verify_worker.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

BOXED_COMMANDS = ("\\boxed", "\\fbox")
MAX_GOLD_CACHE = 100_000
_GOLD_CACHE: dict[str, list] = {}  # this process's parsed references (the verifier process's own)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` with balanced braces, or None."""
    start = max(text.rfind(cmd + "{") for cmd in BOXED_COMMANDS)
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # unbalanced (truncated response)


def _gold_candidates(answer: str) -> list[str]:
    text = answer.strip()
    if len(text) >= 2 and text[0] == text[-1] == "$":
        text = text.strip("$").strip()
    return [text if any(c in text for c in BOXED_COMMANDS) else f"\\boxed{{{text}}}", answer]


def parse_gold(answer: str, cache: dict[str, list] | None = None) -> list:
    """math-verify's parse of the reference (cached in `cache`, this process's by default); [] when it cannot be
    parsed."""
    cache = _GOLD_CACHE if cache is None else cache
    if answer not in cache:
        parsed: list = []
        for candidate in _gold_candidates(answer):
            parsed = parse(candidate, [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)
            if parsed:
                break
        if len(cache) > MAX_GOLD_CACHE:
            cache.clear()
        cache[answer] = parsed
    return cache[answer]


def parse_response(response: str, answer_format: str) -> list:
    """The response's final answer parsed by math-verify; [] when there is none in `answer_format` (boxed | any)."""
    if answer_format == "boxed":
        boxed = last_boxed(response)
        if boxed is None or not boxed.strip():
            return []
        return parse(f"\\boxed{{{boxed}}}", [LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=None)
    extraction = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return parse(response, extraction, parsing_timeout=None)


def default_verify(gold: Any, pred: Any) -> bool:
    """`math_verify.verify` with its own timer off (the caller's covers the whole judgement)."""
    return verify(gold, pred, timeout_seconds=None)


def judge(
    answer_format: str,
    response: str,
    answer: str,
    gold_usable: bool,
    verify_fn: Callable[[Any, Any], bool] = default_verify,
    gold_cache: dict[str, list] | None = None,
) -> str:
    """"no_answer" (no final answer in `answer_format`), "correct" or "wrong"; a reference that did not parse
    (`gold_usable` False) makes every answer wrong."""
    pred = parse_response(response, answer_format)
    if not pred:
        return "no_answer"
    if not gold_usable:
        return "wrong"
    return "correct" if verify_fn(parse_gold(answer, gold_cache), pred) else "wrong"
