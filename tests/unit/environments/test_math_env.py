"""Math environment: math-verify rewards, answer extraction, format knobs, parse-failure counts, timeouts."""

from __future__ import annotations

import time

import pytest

from nemo_jetrl.environments.config import MathEnvConfig
from nemo_jetrl.environments.math_env import MathEnvironment, last_boxed, time_limit

HUGE = "\\boxed{10^{10^{10}}!}"  # sympy tries to evaluate this factorial: never finishes without the timer


@pytest.fixture(scope="module")
def env():
    return MathEnvironment()


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("so the answer is \\boxed{42}.", "42", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{1/2}", "\\frac12", 1.0),
        ("\\boxed{7}", "$7$", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("first \\boxed{3} then \\boxed{5}", "5", 1.0),  # the LAST boxed answer counts
        ("first \\boxed{5} then \\boxed{3}", "5", 0.0),
        ("\\boxed{41}", "42", 0.0),
        ("42", "42", 0.0),  # boxed format required: no answer
        ("\\boxed{42", "42", 0.0),  # unbalanced (truncated) box: no answer
        ("\\boxed{}", "1", 0.0),
    ],
)
def test_boxed_rewards(env, response, answer, expected):
    assert env.reward(response, answer) == expected


def test_last_boxed_handles_nesting_and_fbox():
    assert last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{1} and \\fbox{2}") == "2"
    assert last_boxed("none") is None and last_boxed("\\boxed{1") is None


def test_counts_parse_failures_and_resets_on_pop():
    env = MathEnvironment()
    rewards = env.score(["\\boxed{2}", "no answer here", "\\boxed{3}", "\\boxed{"], ["2", "2", "2", "2"])
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert env.pop_metrics() == {
        "parse_failures": 2.0,
        "gold_parse_failures": 0.0,
        "verify_timeouts": 0.0,
        "num_scored": 4.0,
    }
    assert env.pop_metrics()["num_scored"] == 0.0


def test_format_knobs():
    cfg = MathEnvConfig(correct_reward=1.0, wrong_reward=-0.5, no_answer_reward=-1.0, format_reward=0.25)
    env = MathEnvironment(cfg)
    assert env.score(["\\boxed{4}", "\\boxed{5}", "four"], ["4", "4", "4"]).tolist() == [1.25, -0.25, -1.0]


def test_any_format_lets_math_verify_find_the_answer():
    env = MathEnvironment(MathEnvConfig(answer_format="any"))
    assert env.score(["so x = 4", "3 or maybe 5", "no number"], ["4", "5", "5"]).tolist() == [1.0, 1.0, 0.0]
    assert env.pop_metrics()["parse_failures"] == 1.0


def test_unparseable_reference_is_counted_warned_once_and_needs_an_exact_match():
    env = MathEnvironment()
    with pytest.warns(UserWarning, match=r"cannot parse the reference answer '\?\?\?' as math"):
        assert env.reward("\\boxed{5}", "???") == 0.0
    assert env.reward("\\boxed{???}", "???") == 1.0  # exact string match of the final answer still counts
    assert env.pop_metrics()["gold_parse_failures"] == 2.0


def test_verification_timeout_gives_wrong_reward_and_is_counted():
    """In the shared verifier process (verify_worker.py), started first so its start-up is not timed."""
    env = MathEnvironment(MathEnvConfig(verify_timeout_s=0.3, wrong_reward=-0.1))
    assert env.reward("\\boxed{2}", "2") == 1.0
    env.pop_metrics()
    start = time.perf_counter()
    assert env.reward(HUGE, "2") == -0.1
    assert time.perf_counter() - start < 5.0
    assert env.pop_metrics()["verify_timeouts"] == 1.0


def test_injected_slow_verifier_times_out():
    env = MathEnvironment(MathEnvConfig(verify_timeout_s=0.2), verify_fn=lambda gold, pred: time.sleep(5) or True)
    start = time.perf_counter()
    assert env.reward("\\boxed{1}", "1") == 0.0
    assert time.perf_counter() - start < 2.0
    assert env.pop_metrics()["verify_timeouts"] == 1.0


def test_time_limit_restores_the_previous_handler():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    with time_limit(1.0):
        pass
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"answer_format": "last"}, "answer_format"),
        ({"verify_timeout_s": 0}, "verify_timeout_s"),
        ({"correct_reward": float("nan")}, "correct_reward"),
        ({"typo": 1}, "typo"),
    ],
)
def test_bad_config_names_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MathEnvConfig(**kwargs)


def test_score_length_mismatch(env):
    with pytest.raises(ValueError, match="2 responses but 1 answers"):
        env.score(["a", "b"], ["1"])
