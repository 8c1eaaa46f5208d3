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

Each verification (parse + verify of one response) runs under `verify_timeout_s` in this process's verifier process
(verify_worker.py: a hard limit, from any thread; the process is killed where sympy's C code overruns and a new one
starts). A timeout gives `wrong_reward` and is counted. An injected `verify_fn` runs in-process under a SIGALRM
timer instead (main thread only; elsewhere without a limit, after one warning).
Counts since the last `pop_metrics()`: `parse_failures`, `gold_parse_failures`, `verify_timeouts`, `num_scored`
(the GRPO loop logs them as `train/env/...` and `validation/env/...`).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nemo_jetrl.environments import math_judge
from nemo_jetrl.environments.config import MathEnvConfig
from nemo_jetrl.environments.dapo_verify import NO_ANSWER, dapo_check
from nemo_jetrl.environments.math_judge import default_verify, judge, last_boxed
from nemo_jetrl.environments.verify_worker import VerificationTimeout, VerifierStartError, shared_verifier, time_limit

__all__ = ["MathEnvironment", "VerificationTimeout", "last_boxed", "time_limit"]
MAX_GOLD_WARNINGS = 5
WARMUP = (judge, ("boxed", "\\boxed{1}", "1", True))  # math-verify's imports and parser, before the first limit


class MathEnvironment:
    """Scores decoded responses against reference answers with math-verify; see the module docstring.

    `verify_fn(gold, pred) -> bool` defaults to `math_verify.verify` with its own timer off (ours covers the whole
    verification), run in the verifier process; an injected one (tests: a slow one) runs in-process.
    """

    def __init__(self, cfg: MathEnvConfig | None = None, *, verify_fn: Callable[[Any, Any], bool] | None = None):
        self.cfg = cfg if cfg is not None else MathEnvConfig()
        self._verify = verify_fn or default_verify
        self._hard_limit = verify_fn is None and self.cfg.verify_timeout_s is not None
        self._gold_cache: dict[str, list] = {}
        self._bad_gold_warned: set[str] = set()
        self._thread_warned = False
        self._counts = dict.fromkeys(("parse_failures", "gold_parse_failures", "verify_timeouts", "num_scored"), 0)

    # ------------------------------------------------------------------ parsing
    def parse_gold(self, answer: str) -> list:
        """math-verify's parse of the reference (cached); [] when it cannot be parsed."""
        return math_judge.parse_gold(answer, self._gold_cache)

    def parse_response(self, response: str) -> list:
        """The response's final answer parsed by math-verify; [] when there is none in `answer_format`."""
        return math_judge.parse_response(response, self.cfg.answer_format)

    # ------------------------------------------------------------------ rewards
    def reward(self, response: str, answer: str) -> float:
        """Reward of one decoded response (counts parse failures / timeouts for `pop_metrics`)."""
        return self._rewards([response], [answer])[0]

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """Rewards of decoded responses: float32 `[n]` (one batch to the verifier process)."""
        if len(responses) != len(answers):
            raise ValueError(f"score: {len(responses)} responses but {len(answers)} answers")
        return torch.tensor(self._rewards(list(responses), list(answers)), dtype=torch.float32)

    def _rewards(self, responses: list[str], answers: list[str]) -> list[float]:
        cfg = self.cfg
        self._counts["num_scored"] += len(responses)
        if cfg.math_verify_impl == "dapo_math_verify":
            checks = [dapo_check(r, a) for r, a in zip(responses, answers)]
            self._counts["parse_failures"] += sum(pred == NO_ANSWER for _, pred in checks)
            return [cfg.correct_reward if correct else cfg.wrong_reward for correct, _ in checks]
        usable = [self._gold_usable(a) for a in answers]
        return [self._reward_of(v) for v in self._judge(responses, answers, usable)]

    def _gold_usable(self, answer: str) -> bool:
        """Whether the reference parsed (counted and warned about where it parsed to no math expression)."""
        try:
            with time_limit(self.cfg.verify_timeout_s):
                gold = self.parse_gold(answer)
        except VerificationTimeout:
            self._gold_cache[answer] = gold = []
        if not any(not isinstance(g, str) for g in gold):  # strings only: no math expression
            self._counts["gold_parse_failures"] += 1
            self._warn_bad_gold(answer)
        return bool(gold)

    def _reward_of(self, verdict: str) -> float:
        cfg = self.cfg
        if verdict == "timeout":
            self._counts["verify_timeouts"] += 1
            return cfg.wrong_reward
        if verdict == "no_answer":
            self._counts["parse_failures"] += 1
            return cfg.no_answer_reward
        return (cfg.correct_reward if verdict == "correct" else cfg.wrong_reward) + cfg.format_reward

    def _judge(self, responses: list[str], answers: list[str], usable: list[bool]) -> list[str]:
        """math_judge.judge of each response ("no_answer", "correct", "wrong", or "timeout"): in the verifier process
        (a hard limit), or in-process under the SIGALRM timer."""
        cfg = self.cfg
        if self._hard_limit:
            jobs = [(cfg.answer_format, r, a, u) for r, a, u in zip(responses, answers, usable)]
            try:
                outcomes = shared_verifier(WARMUP).run_many(judge, jobs, cfg.verify_timeout_s)
            except VerifierStartError as err:  # e.g. inside a daemonic process, which may not have children
                self._hard_limit = False
                warnings.warn(f"{err}: verifying in-process, under a timer that sympy's C code can overrun",
                              stacklevel=4)  # fmt: skip
            else:
                for kind, value in outcomes:
                    if kind == "error":  # raised in the child: the caller's, as in-process
                        raise value
                return [value if kind == "ok" else "timeout" for kind, value in outcomes]
        self._warn_off_main_thread()
        verdicts = []
        for r, a, u in zip(responses, answers, usable):
            try:
                with time_limit(cfg.verify_timeout_s):
                    verdicts.append(judge(cfg.answer_format, r, a, u, self._verify, self._gold_cache))
            except VerificationTimeout:
                verdicts.append("timeout")
        return verdicts

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
        if self._thread_warned or self.cfg.verify_timeout_s is None or self._hard_limit:
            return
        if threading.current_thread() is not threading.main_thread():
            self._thread_warned = True
            warnings.warn(
                "env.math.verify_timeout_s applies on the main thread only; verifying without a limit", stacklevel=3
            )
