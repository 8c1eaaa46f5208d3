"""Logger: metrics.jsonl lines, NaN spelling, TensorBoard read-back, optional backends, config.yaml, plotting."""

import io
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf
from rich.console import Console

from nemo_jetrl.utils.config import LoggerConfig
from nemo_jetrl.utils.logger import Logger, console_summary
from nemo_jetrl.utils.logger_backends import MissingBackendWarning, flatten_config
from nemo_jetrl.utils.metrics_jsonl import read_metrics_jsonl

REPO = Path(__file__).resolve().parents[3]


def _cfg(tmp_path, **overrides) -> LoggerConfig:
    cfg = {
        "log_dir": str(tmp_path / "run"),
        "tensorboard_enabled": False,
        "wandb_enabled": False,
        "wandb": {"project": "p", "name": "n"},
        "mlflow_enabled": False,
        "mlflow": {"experiment_name": "e", "tracking_uri": None},
        "plot_period": None,
    }
    return LoggerConfig(**{**cfg, **overrides})


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_one_line_per_call_with_exact_values(tmp_path):
    with Logger(_cfg(tmp_path)) as logger:
        logger.log_metrics({"reward_mean": 0.25, "num_tokens": 7}, step=1, prefix="train")
        logger.log_metrics({"accuracy": 0.5}, step=1, prefix="validation/")
        logged = logger.log_metrics({"a": torch.tensor(1.5), "b": np.float32(2.0), "c": True, "d": np.array(3)}, step=2)
        # a killed run keeps every complete line: the file is complete before close()
        assert len(logger.metrics_path.read_text().splitlines()) == 3
    assert logged == {"a": 1.5, "b": 2.0, "c": 1, "d": 3}
    assert _lines(tmp_path / "run" / "metrics.jsonl") == [
        {"step": 1, "train/reward_mean": 0.25, "train/num_tokens": 7},
        {"step": 1, "validation/accuracy": 0.5},
        {"step": 2, "a": 1.5, "b": 2.0, "c": 1, "d": 3},
    ]


def test_jsonl_non_finite_values_are_strict_json_strings(tmp_path):
    with Logger(_cfg(tmp_path)) as logger:
        logger.log_metrics({"x": float("nan"), "y": float("inf"), "z": -math.inf, "w": 1.0}, step=3)
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # no bare JS tokens: strict JSON
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare constant {c}"))
    assert record == {"step": 3, "x": "nan", "y": "inf", "z": "-inf", "w": 1.0}
    series = read_metrics_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert math.isnan(series["x"][1][0]) and series["y"][1][0] == math.inf and series["z"][1][0] == -math.inf


@pytest.mark.parametrize(
    ("metrics", "step", "match"),
    [
        ({"bad": "high"}, 1, "metric 'bad' must be a real number"),
        ({"vec": torch.ones(2)}, 1, "metric 'vec'"),
        ({"step": 1.0}, 1, "'step' is reserved"),
        ({"x": 1.0}, 1.5, "step must be an int"),
    ],
)
def test_log_metrics_rejects_bad_input(tmp_path, metrics, step, match):
    with Logger(_cfg(tmp_path)) as logger:
        with pytest.raises(ValueError, match=match):
            logger.log_metrics(metrics, step=step)


def test_tensorboard_events_hold_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(_cfg(tmp_path, tensorboard_enabled=True)) as logger:
        logger.log_metrics({"reward_mean": 0.375}, step=4, prefix="train")
        logger.log_metrics({"reward_mean": 0.625}, step=5, prefix="train")
        tb_dir = tmp_path / "run" / "tensorboard"
        assert list(tb_dir.glob("events.out.tfevents.*")), "no event file"
        acc = EventAccumulator(str(tb_dir))
        acc.Reload()  # read while the writer is still open: flushed per call
        events = acc.Scalars("train/reward_mean")
    assert [(e.step, e.value) for e in events] == [(4, 0.375), (5, 0.625)]


def test_tensorboard_disabled_writes_no_events(tmp_path):
    with Logger(_cfg(tmp_path)) as logger:
        logger.log_metrics({"x": 1.0}, step=0)
        assert logger.backend_names == ["LocalFilesBackend"]
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_wandb_and_mlflow_enabled_but_missing_warn_and_continue(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import raises ImportError even where installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.warns(MissingBackendWarning) as record:
        logger = Logger(_cfg(tmp_path, wandb_enabled=True, mlflow_enabled=True))
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert "logger.wandb_enabled" in messages[0] and "'wandb' package is not installed" in messages[0]
    assert "logger.mlflow_enabled" in messages[1] and "'mlflow' package is not installed" in messages[1]
    with logger:
        assert logger.backend_names == ["LocalFilesBackend"]
        logger.log_metrics({"x": 2.0}, step=1)
        logger.log_config({"a": 1})
    assert _lines(tmp_path / "run" / "metrics.jsonl") == [{"step": 1, "x": 2.0}]


class _Recorder:
    """A stand-in module: every attribute is a function that records its call."""

    def __init__(self, name, returns=None):
        self.module = types.ModuleType(name)
        self.calls = []
        self._returns = returns or {}

    def add(self, *names):
        for name in names:
            setattr(self.module, name, self._make(name))
        return self

    def _make(self, name):
        def fn(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self._returns.get(name)

        return fn


def test_wandb_and_mlflow_backends_forward_calls(tmp_path, monkeypatch):
    run = _Recorder("run").add("log", "finish")
    run.module.config = _Recorder("config").add("update").module
    wandb = _Recorder("wandb", returns={"init": run.module}).add("init")
    mlflow = _Recorder("mlflow").add(
        "set_tracking_uri", "set_experiment", "start_run", "log_metrics", "log_params", "end_run"
    )
    monkeypatch.setitem(sys.modules, "wandb", wandb.module)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow.module)
    cfg = _cfg(tmp_path, wandb_enabled=True, mlflow_enabled=True)
    cfg.mlflow = {"experiment_name": "exp", "tracking_uri": "file:///tmp/mlruns"}  # validated into MlflowConfig
    with Logger(cfg) as logger:
        assert logger.backend_names == ["LocalFilesBackend", "WandbBackend", "MlflowBackend"]
        logger.log_config({"policy": {"lr": 1e-5, "betas": [0.9, 0.99]}})
        logger.log_metrics({"reward_mean": 0.5}, step=3, prefix="train")
    assert wandb.calls == [("init", (), {"dir": str(tmp_path / "run"), "project": "p", "name": "n"})]
    assert [c[0] for c in run.calls] == ["log", "finish"]
    assert run.calls[0][1:] == (({"train/reward_mean": 0.5},), {"step": 3})
    assert mlflow.calls == [
        ("set_tracking_uri", ("file:///tmp/mlruns",), {}),
        ("set_experiment", ("exp",), {}),
        ("start_run", (), {}),
        ("log_params", ({"policy.lr": "1e-05", "policy.betas": "[0.9, 0.99]"},), {}),
        ("log_metrics", ({"train/reward_mean": 0.5},), {"step": 3}),
        ("end_run", (), {}),
    ]


def test_config_yaml_written_and_reloadable(tmp_path):
    cfg = OmegaConf.create({"grpo": {"steps": 3}, "policy": {"lr": 5e-5, "steps_copy": "${grpo.steps}"}, "x": None})
    with Logger(_cfg(tmp_path, tensorboard_enabled=True)) as logger:
        path = logger.log_config(cfg)
    assert path == tmp_path / "run" / "config.yaml"
    assert yaml.safe_load(path.read_text()) == {
        "grpo": {"steps": 3},
        "policy": {"lr": 5e-5, "steps_copy": 3},
        "x": None,
    }
    with Logger(_cfg(tmp_path)) as logger:  # plain mappings with Paths / tuples
        logger.log_config({"dir": Path("/a/b"), "t": (1, 2)})
    assert yaml.safe_load(path.read_text()) == {"dir": "/a/b", "t": [1, 2]}


def test_master_config_logger_section_is_accepted(tmp_path):
    section = yaml.safe_load((REPO / "examples/configs/grpo_base.yaml").read_text())["logger"]
    with Logger(LoggerConfig(**{**section, "log_dir": str(tmp_path / "r")})) as logger:
        assert logger.log_dir == tmp_path / "r" and logger.cfg.plot_period == 5
        assert logger.backend_names == ["LocalFilesBackend", "TensorBoardBackend"]  # tensorboard_enabled: true
    with pytest.raises(TypeError, match="^Logger expects the validated config section LoggerConfig, got dict: "):
        Logger({"log_dir": str(tmp_path / "d")})  # a dict is refused (build LoggerConfig from it)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"tensorbord_enabled": True}, "tensorbord_enabled"),
        ({"log_dir": None}, "log_dir"),
        ({"log_dir": ""}, "log_dir"),
        ({"plot_period": -1}, "plot_period"),
        ({"wandb_enabled": "maybe"}, "wandb_enabled"),
    ],
)
def test_bad_logger_config_names_the_key(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        Logger(_cfg(tmp_path, **overrides))


def test_closed_logger_refuses_and_close_is_idempotent(tmp_path):
    logger = Logger(_cfg(tmp_path))
    logger.close()
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log_metrics({"x": 1.0}, step=0)


def test_plot_period_and_final_plots(tmp_path):
    logger = Logger(_cfg(tmp_path, plot_period=2))
    logger.log_metrics({"reward_mean": 0.1}, step=1, prefix="train")
    assert logger.maybe_plot(1) == []
    logger.log_metrics({"reward_mean": 0.2}, step=2, prefix="train")
    assert logger.maybe_plot(2) == [tmp_path / "run" / "plots" / "reward_accuracy.png"]
    (tmp_path / "run" / "plots" / "reward_accuracy.png").unlink()
    logger.close()  # final refresh
    assert (tmp_path / "run" / "plots" / "reward_accuracy.png").stat().st_size > 1000


def test_console_summary_line():
    buf = io.StringIO()
    metrics = {"train/reward_mean": 0.53125, "validation/accuracy": 0.75, "timing/generation": 0.123, "other": 1}
    text = console_summary(
        metrics,
        12,
        keys=("train/reward_mean", "validation/accuracy", "missing", "timing/"),
        total_steps=100,
        console=Console(file=buf, width=200),
    )
    assert text == "step 12/100 │ reward_mean 0.5312 │ val/accuracy 0.75 │ t/generation 0.12s"
    assert buf.getvalue().strip() == text


def test_flatten_config():
    assert flatten_config({"a": {"b": {"c": 1}, "d": [1]}, "e": None}) == {"a.b.c": 1, "a.d": [1], "e": None}
