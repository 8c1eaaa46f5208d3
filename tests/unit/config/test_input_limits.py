"""Inputs the run cannot use are refused at load / validation time with one line naming the key (issue 46): a YAML
"billion laughs" in well under a second, integers beyond what the run can use, empty output paths, a metric name
the checkpoint ranking cannot read, a learning rate above 1 unless forced."""

from __future__ import annotations

import importlib.util
import signal
import time
from pathlib import Path

import pytest

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.schema import validate_config

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "configs" / "grpo_tiny.yaml"


def _cli():
    spec = importlib.util.spec_from_file_location("run_grpo_cli_limits", REPO / "examples" / "run_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _laughs(path: Path, depth: int = 9) -> Path:
    """381 bytes that expand to 9**9 (~387 million) strings."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghij"
    for i in range(1, depth):
        ref = f"*{names[i - 1]}"
        lines.append(f"{names[i]}: &{names[i]} [{','.join([ref] * 9)}]")
    path.write_text("\n".join(lines) + "\n")
    return path


class _StillRunning(Exception):
    pass


def _within(seconds: int, fn):
    """fn() under an alarm: a hang fails the test after `seconds` instead of blocking the suite."""

    def on_alarm(signum, frame):
        raise _StillRunning(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        start = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - start
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_billion_laughs_is_refused_in_well_under_a_second(tmp_path, capsys):
    path = _laughs(tmp_path / "laughs.yaml")
    assert path.stat().st_size < 400

    def load():
        with pytest.raises(ConfigError, match=r"laughs\.yaml: its anchors and aliases expand to more than") as err:
            load_config(path)
        return str(err.value)

    message, seconds = _within(5, load)
    assert seconds < 0.5 and "\n" not in message
    code, _ = _within(5, lambda: _cli()(["--config", str(path), "--validate-only"]))
    assert code == 2 and capsys.readouterr().err.startswith(f"error: {path}")


def test_a_yaml_file_of_many_megabytes_is_refused(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("a: 1\n" + "# padding\n" * 1_000_000)
    with pytest.raises(ConfigError, match=r"huge\.yaml is .* bytes; config files are limited to"):
        load_config(path)


def test_shared_anchors_of_a_real_config_still_load(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &b {lr: 1.0e-5, betas: [0.9, 0.99]}\nx: *b\ny: *b\n")
    assert load_config(path).y.betas == [0.9, 0.99]


@pytest.mark.parametrize(
    "override, key",
    [
        ("grpo.seed=100000000000000000000000", "grpo.seed"),
        ("grpo.seed=4294967296", "grpo.seed"),  # numpy's and vLLM's seeds are 32-bit
        ("data.seed=4294967296", "data.seed"),
        ("grpo.num_prompts_per_step=100000000000000000000000", "grpo.num_prompts_per_step"),
        ("grpo.max_num_steps=2147483648", "grpo.max_num_steps"),
        ("policy.train_micro_batch_size=99999999999999", "policy.train_micro_batch_size"),
    ],
)
def test_integers_beyond_what_the_run_can_use_name_the_key(override, key, capsys):
    with pytest.raises(ConfigError, match=rf"{key}: \d+ is invalid: input should be less than or equal to \d+"):
        validate_config(load_config(TINY, [override]))
    assert _cli()(["--config", str(TINY), override, "--validate-only"]) == 2
    assert f" {key}: " in " " + capsys.readouterr().err.removeprefix("error: ")


def test_the_largest_allowed_seed_validates():
    cfg = validate_config(load_config(TINY, ["grpo.seed=4294967295", "data.seed=4294967295"]))
    assert cfg.grpo.seed == 4294967295


@pytest.mark.parametrize("value", ["''", "'  '"])
def test_an_empty_checkpoint_dir_is_refused(value):
    with pytest.raises(ConfigError, match=r"checkpointing\.checkpoint_dir: '\s*' is empty: give a directory"):
        validate_config(load_config(TINY, [f"checkpointing.checkpoint_dir={value}"]))


def test_validate_only_checks_the_checkpoint_metric_name(capsys):
    args = ["--config", str(TINY), "checkpointing.metric_name=accuracy", "--validate-only"]
    assert _cli()(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpointing.metric_name: ") and "'val:<metric>'" in err
    assert validate_config(load_config(TINY, ["checkpointing.metric_name=val:accuracy"]))


def test_a_learning_rate_above_one_is_refused_unless_forced():
    with pytest.raises(ConfigError, match=r"policy\.optimizer\.lr: 1e\+30 .*policy\.optimizer\.allow_large_lr=true"):
        validate_config(load_config(TINY, ["policy.optimizer.lr=1e30"]))
    forced = validate_config(load_config(TINY, ["policy.optimizer.lr=1e30", "policy.optimizer.allow_large_lr=true"]))
    assert forced.policy.optimizer.lr == 1e30
    assert validate_config(load_config(TINY, ["policy.optimizer.lr=1.0"])).policy.optimizer.lr == 1.0
