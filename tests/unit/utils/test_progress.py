"""RunProgress: silent when disabled, step/phase/metrics shown when enabled."""

import io

import pytest
from rich.console import Console

from nemo_jetrl.utils.progress import RunProgress


def _drive(progress):
    with progress:
        for step in range(1, 4):
            with progress.phase("generation"):
                pass
            progress.phase("train")
            progress.advance(metrics={"train/reward_mean": 0.5 * step / 3, "unwatched": 1.0})
        progress.update_metrics({"validation/accuracy": 0.875})


@pytest.mark.parametrize("enabled", [False, None])
def test_disabled_prints_nothing(capsys, enabled):
    buf = io.StringIO()  # not a terminal: enabled=None means off
    progress = RunProgress(5, enabled=enabled, console=Console(file=buf))
    _drive(progress)
    assert not progress.enabled
    assert buf.getvalue() == ""
    assert capsys.readouterr() == ("", "")
    assert progress.completed == 3 and progress.metrics_text() == "reward 0.500  acc 0.875"


def test_enabled_shows_step_phase_and_metrics():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160, color_system=None)
    progress = RunProgress(5, enabled=None, console=console)
    assert progress.enabled
    _drive(progress)
    out = buf.getvalue()
    assert "3/5" in out and "train" in out and "reward 0.500  acc 0.875" in out


def test_phase_scope_restores_previous_phase():
    progress = RunProgress(2, enabled=False)
    progress.phase("generation")
    with progress.phase("logprobs"):
        assert progress.current_phase == "logprobs"
    assert progress.current_phase == "generation"
    progress.advance(step=2)
    assert progress.completed == 2


def test_bad_total_steps():
    with pytest.raises(ValueError, match="total_steps"):
        RunProgress(-1, enabled=False)
