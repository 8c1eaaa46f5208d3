"""Math environment: reward from math-verify (parse the final answer, verify it against the reference).

Per response (config `env.math`: environments/config.py's `MathEnvConfig`, NeMo-RL's `hf_math_verify` scheme plus format knobs):

1. Extract the final answer. `answer_format: boxed` takes the LAST `\\boxed{...}` / `\\fbox{...}` of the response
   (balanced braces); `any` lets math-verify find it (boxed first, then the last LaTeX / plain expression,
   "the answer is X", ...). No extractable answer = a parse failure: reward `no_answer_reward` (a format penalty
   when negative).
2. Verify with `math_verify.verify(gold, pred)`: `correct_reward` or `wrong_reward`, plus `format_reward` (a bonus
   for having a final answer in the required format, right or wrong; R1-style format reward).
3. The reference answer is parsed as `\\boxed{<answer>}` (then as free text). A reference math-verify cannot turn
   into a math expression (e.g. `"???"`) is counted in `gold_parse_failures` and warned about
   (first 5 distinct); responses to it are then right only on an exact string match of their final answer.

`math_verify_impl: dapo_math_verify` scores with DAPO's string check instead (environments/dapo_verify.py):
`correct_reward` or `wrong_reward`, a response without an `Answer:` line counted as a parse failure.

Each verification (parse + verify of one response) runs under `verify_timeout_s` (a SIGALRM interval timer, main
thread only; elsewhere it runs without a limit, after one warning). A timeout gives `wrong_reward` and is counted.
Counts since the last `pop_metrics()`: `parse_failures`, `gold_parse_failures`, `verify_timeouts`, `num_scored`
(the GRPO loop logs them as `train/env/...` and `validation/env/...`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from nemo_jetrl.environments.config import MathEnvConfig
from nemo_jetrl.environments.dapo_verify import NO_ANSWER, dapo_check

AnswerFormat = Literal["boxed", "any"]
_BOXED_COMMANDS = ("\\boxed", "\\fbox")
MAX_GOLD_WARNINGS = 5


class VerificationTimeout(BaseException):
    """Raised by the timer inside math-verify/sympy; a BaseException so their `except Exception` cannot swallow it."""


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` with balanced braces, or None."""
    start = max(text.rfind(cmd + "{") for cmd in _BOXED_COMMANDS)
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # unbalanced (truncated response)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise VerificationTimeout in the block after `seconds` (no limit when None or off the main thread)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise VerificationTimeout(f"verification exceeded {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _gold_candidates(answer: str) -> list[str]:
    text = answer.strip()
    if len(text) >= 2 and text[0] == text[-1] == "$":
        text = text.strip("$").strip()
    return [text if any(c in text for c in _BOXED_COMMANDS) else f"\\boxed{{{text}}}", answer]


class MathEnvironment:
    """Scores decoded responses against reference answers with math-verify; see the module docstring.

    `verify_fn(gold, pred) -> bool` defaults to `math_verify.verify` with its own timer off (ours covers the whole
    verification); tests pass a slow one to exercise the timeout.
    """

    def __init__(self, cfg: MathEnvConfig | None = None, *, verify_fn: Callable[[Any, Any], bool] | None = None):
        self.cfg = cfg if cfg is not None else MathEnvConfig()
        self._verify = verify_fn or (lambda gold, pred: verify(gold, pred, timeout_seconds=None))
        self._gold_cache: dict[str, list] = {}
        self._bad_gold_warned: set[str] = set()
        self._thread_warned = False
        self._counts = dict.fromkeys(("parse_failures", "gold_parse_failures", "verify_timeouts", "num_scored"), 0)

    # ------------------------------------------------------------------ parsing
    def parse_gold(self, answer: str) -> list:
        """math-verify's parse of the reference (cached); [] when it cannot be parsed."""
        if answer not in self._gold_cache:
            parsed: list = []
            for candidate in _gold_candidates(answer):
                parsed = parse(candidate, [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)
                if parsed:
                    break
            if len(self._gold_cache) > 100_000:
                self._gold_cache.clear()
            self._gold_cache[answer] = parsed
        return self._gold_cache[answer]

    def parse_response(self, response: str) -> list:
        """The response's final answer parsed by math-verify; [] when there is none in `answer_format`."""
        if self.cfg.answer_format == "boxed":
            boxed = last_boxed(response)
            if boxed is None or not boxed.strip():
                return []
            return parse(f"\\boxed{{{boxed}}}", [LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=None)
        extraction = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
        return parse(response, extraction, parsing_timeout=None)

    # ------------------------------------------------------------------ rewards
    def reward(self, response: str, answer: str) -> float:
        """Reward of one decoded response (counts parse failures / timeouts for `pop_metrics`)."""
        cfg = self.cfg
        self._counts["num_scored"] += 1
        if cfg.math_verify_impl == "dapo_math_verify":
            correct, pred = dapo_check(response, answer)
            self._counts["parse_failures"] += pred == NO_ANSWER
            return cfg.correct_reward if correct else cfg.wrong_reward
        try:
            with time_limit(cfg.verify_timeout_s):
                gold = self.parse_gold(answer)
        except VerificationTimeout:
            self._gold_cache[answer] = gold = []
        if not any(not isinstance(g, str) for g in gold):  # strings only: no math expression
            self._counts["gold_parse_failures"] += 1
            self._warn_bad_gold(answer)
        self._warn_off_main_thread()
        try:
            with time_limit(cfg.verify_timeout_s):
                pred = self.parse_response(response)
                if not pred:
                    self._counts["parse_failures"] += 1
                    return cfg.no_answer_reward
                correct = bool(gold) and bool(self._verify(gold, pred))
        except VerificationTimeout:
            self._counts["verify_timeouts"] += 1
            return cfg.wrong_reward
        return (cfg.correct_reward if correct else cfg.wrong_reward) + cfg.format_reward

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """Rewards of decoded responses: float32 `[n]`."""
        if len(responses) != len(answers):
            raise ValueError(f"score: {len(responses)} responses but {len(answers)} answers")
        return torch.tensor([self.reward(r, a) for r, a in zip(responses, answers)], dtype=torch.float32)

    def pop_metrics(self) -> dict[str, float]:
        """Counts since the last call (`parse_failures`, `gold_parse_failures`, `verify_timeouts`, `num_scored`)."""
        out = {k: float(v) for k, v in self._counts.items()}
        self._counts = dict.fromkeys(self._counts, 0)
        return out

    def _warn_bad_gold(self, answer: str) -> None:
        if answer in self._bad_gold_warned or len(self._bad_gold_warned) >= MAX_GOLD_WARNINGS:
            return
        self._bad_gold_warned.add(answer)
        more = " (further ones are only counted)" if len(self._bad_gold_warned) == MAX_GOLD_WARNINGS else ""
        warnings.warn(
            f"math-verify cannot parse the reference answer {answer[:200]!r} as math: only an exact string match "
            f"of a response's final answer counts as correct; counted in env/gold_parse_failures{more}",
            stacklevel=3,
        )

    def _warn_off_main_thread(self) -> None:
        if self._thread_warned or self.cfg.verify_timeout_s is None:
            return
        if threading.current_thread() is not threading.main_thread():
            self._thread_warned = True
            warnings.warn(
                "env.math.verify_timeout_s applies on the main thread only; verifying without a limit", stacklevel=3
            )
