"""`checkpointing.checkpoint_must_save_by`: the 'DD:HH:MM:SS' parser and when a run stops (a fake clock)."""

import pytest

from nemo_jetrl.utils.save_deadline import SaveDeadline, format_must_save_by, parse_must_save_by


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:00:00:00", 0), ("00:03:45:00", 13500), ("01:00:00:01", 86401), ("00:00:90:00", 5400)],
)
def test_parse_reads_nemo_rl_budgets(text, seconds):
    assert parse_must_save_by(text) == seconds


@pytest.mark.parametrize("bad", ["3:45:00", "00:03:45:00:00", "00:03:4x:00", "00:-1:00:00", "", "1.5:0:0:0"])
def test_parse_refuses_anything_else_in_one_line(bad):
    with pytest.raises(ValueError, match=r"^checkpointing.checkpoint_must_save_by must be 'DD:HH:MM:SS'") as err:
        parse_must_save_by(bad)
    assert "\n" not in str(err.value)


def test_format_round_trips():
    for seconds in (0, 59, 3600, 13500, 86401, 200000):
        assert parse_must_save_by(format_must_save_by(seconds)) == seconds
    assert format_must_save_by(-5) == "00:00:00:00"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_stops_when_the_next_step_would_pass_the_budget():
    clock = Clock()
    deadline = SaveDeadline("00:00:01:40", clock=clock, age_s=0.0)  # 100 s from t = 0
    clock.t = 10.0  # start-up: counts against the budget, not as a step
    deadline.start_steps()
    clock.t = 40.0  # step 1 took 30 s: 40 spent + 30 expected = 70 < 100
    assert not deadline.step_done()
    clock.t = 65.0  # step 2 took 25 s: 65 + 27.5 = 92.5 < 100
    assert not deadline.step_done()
    clock.t = 80.0  # step 3 took 15 s: 80 + 23.3 >= 100: stop before step 4
    assert deadline.step_done()
    assert "reached after step 3: saved step 3" in deadline.stop_line(3, saved=True)
    assert "00:00:01:40" in deadline.stop_line(3, saved=True)


def test_a_spent_budget_stops_after_the_first_step_and_none_never_stops():
    clock = Clock()
    spent = SaveDeadline("00:00:00:00", clock=clock, age_s=0.0)
    spent.start_steps()
    assert spent.step_done()
    endless = SaveDeadline(None, clock=clock, age_s=0.0)
    endless.start_steps()
    clock.t = 1e9
    assert not endless.step_done() and not endless.due()


def test_the_budget_counts_from_the_process_start():
    """A process 1.5 s old (it slept first) reads an age of 1.5 s or more, and a budget shorter than its age is
    spent before its first step."""
    import subprocess
    import sys

    code = ("import time; time.sleep(1.5); from nemo_jetrl.utils.save_deadline import process_age_s as a; "
            "print(a())")  # fmt: skip
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.5 <= age < 60.0
    clock = Clock()
    assert SaveDeadline("00:00:00:01", clock=clock, age_s=2.0).due()  # 2 s old, a 1 s budget
    assert not SaveDeadline("00:00:00:03", clock=clock, age_s=2.0).due()
