"""The verifier process (nemo_jetrl/environments/verify_worker.py): a Python-level overrun ends in the child, which
lives on; work the child's timer cannot stop is killed by the parent and the next call (or the rest of a batch) gets
a new child; errors come back as raised; MathEnvironment's default path uses it from any thread."""

from __future__ import annotations

import operator
import signal
import threading
import time
import warnings

import pytest

from nemo_jetrl.environments.config import MathEnvConfig
from nemo_jetrl.environments.math_env import MathEnvironment
from nemo_jetrl.environments.verify_worker import GRACE_S, VerificationTimeout, VerifierProcess, VerifierStartError

HUGE = "\\boxed{10^{10^{10}}!}"  # sympy evaluates the power and the factorial: no end without a limit


@pytest.fixture
def verifier():
    v = VerifierProcess()
    assert v.run(abs, (-3,), 5.0) == 3  # started, warm
    yield v
    v.close()


def test_a_python_level_overrun_ends_in_the_child_which_lives_on(verifier):
    pid = verifier.pid
    start = time.perf_counter()
    with pytest.raises(VerificationTimeout):
        verifier.run(time.sleep, (5.0,), 0.2)
    assert time.perf_counter() - start < 0.2 + GRACE_S  # the child's timer, not the kill
    assert verifier.kills == 0 and verifier.pid == pid and verifier.run(abs, (-4,), 5.0) == 4


def test_work_the_childs_timer_cannot_stop_is_killed_and_the_next_call_gets_a_new_child(verifier):
    """With SIGALRM blocked in the child its timer never fires (as when a C loop holds the interpreter): the parent
    kills the child after the limit and the grace, and starts another for the next call."""
    pid = verifier.pid
    verifier.run(signal.pthread_sigmask, (signal.SIG_BLOCK, {signal.SIGALRM}), 5.0)
    start = time.perf_counter()
    with pytest.raises(VerificationTimeout, match="killed"):
        verifier.run(time.sleep, (30.0,), 0.2)
    waited = time.perf_counter() - start
    assert 0.2 + GRACE_S <= waited < 0.2 + GRACE_S + 3.0 and verifier.kills == 1 and verifier.pid is None
    assert verifier.run(abs, (-5,), 5.0) == 5 and verifier.pid not in (None, pid)


def test_what_the_function_raises_comes_back_as_raised(verifier):
    with pytest.raises(ValueError, match="invalid literal"):
        verifier.run(int, ("x",), 5.0)
    assert verifier.run(int, ("7",), 5.0) == 7


def test_the_default_math_environment_times_out_a_huge_answer_off_the_main_thread_too():
    """The in-process timer works on the main thread only; the verifier process limits every thread."""
    env = MathEnvironment(MathEnvConfig(verify_timeout_s=0.3, wrong_reward=-0.1))
    assert env.reward("\\boxed{4}", "4") == 1.0  # the shared verifier started and warm
    out: dict[str, float] = {}

    def score() -> None:
        start = time.perf_counter()
        out["reward"] = env.reward(HUGE, "2")
        out["seconds"] = time.perf_counter() - start

    worker = threading.Thread(target=score)
    worker.start()
    worker.join(timeout=30.0)
    assert not worker.is_alive() and out["reward"] == -0.1 and out["seconds"] < 0.3 + GRACE_S + 3.0
    metrics = env.pop_metrics()
    assert metrics["verify_timeouts"] == 1.0 and metrics["num_scored"] == 2.0


def test_a_batch_goes_on_in_a_new_child_after_the_job_that_killed_the_old_one(verifier):
    """run_many: the third job overruns with the child's timer blocked; it alone times out, the child is killed, and
    the fourth job runs in a new child."""
    jobs = [(abs, -1), (signal.pthread_sigmask, signal.SIG_BLOCK, {signal.SIGALRM}), (time.sleep, 30.0), (abs, -2)]
    outcomes = verifier.run_many(operator.call, jobs, 0.2)
    assert [kind for kind, _ in outcomes] == ["ok", "ok", "timeout", "ok"] and verifier.kills == 1
    assert outcomes[0][1] == 1 and outcomes[3][1] == 2 and "killed" in outcomes[2][1]


def test_a_child_whose_warmup_fails_is_a_start_error_naming_its_exit():
    """MathEnvironment falls back to the in-process timer on VerifierStartError, with one warning."""
    broken = VerifierProcess(warmup=(int, ("x",)))
    with pytest.raises(VerifierStartError, match="exited before it was ready \\(exit code 1\\)"):
        broken.run(abs, (-1,), 5.0)
    assert broken.pid is None


def test_the_math_environment_verifies_in_process_with_one_warning_where_no_verifier_starts(monkeypatch):
    from nemo_jetrl.environments import math_env

    broken = VerifierProcess(warmup=(int, ("x",)))
    monkeypatch.setattr(math_env, "shared_verifier", lambda warmup=None: broken)
    env = MathEnvironment()
    with pytest.warns(UserWarning, match="verifying in-process"):
        assert env.reward("\\boxed{2}", "2") == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert env.score(["\\boxed{3}", "\\boxed{5}"], ["3", "4"]).tolist() == [1.0, 0.0]
