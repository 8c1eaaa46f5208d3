"""The config-drift warning on resume (`grpo_checkpoint.restore`): settings that make a resumed run a different run are named."""

from __future__ import annotations

from types import SimpleNamespace

from nemo_jetrl.algorithms import grpo_checkpoint
from nemo_jetrl.schema import validate_config

CFG = validate_config({"checkpointing": {"checkpoint_dir": "ckpt"}})  # the run's; a checkpoint holds its dump


def _restore(saved_cfg: dict, capsys) -> tuple[int, str, list]:
    loaded = []
    run = SimpleNamespace(cfg=CFG, policy=SimpleNamespace(load_state_dict=loaded.append))
    step = grpo_checkpoint.restore(run, {"policy": {"model": "weights"}, "step": 3, "config": saved_cfg})
    return step, capsys.readouterr().err, loaded


def test_resume_with_the_same_run_settings_warns_nothing(capsys):
    changed = CFG.model_dump()
    changed["grpo"]["max_num_steps"] = 20  # running longer is the same run
    changed["policy"]["optimizer"]["lr"] = 1e-4
    step, err, loaded = _restore(changed, capsys)
    assert step == 3 and loaded == [{"model": "weights"}]
    assert "warning" not in err and "resumed from step 3" in err


def test_resume_names_every_changed_run_setting(capsys):
    changed = CFG.model_dump()
    changed["policy"]["precision"] = "bf16"
    changed["data"]["seed"] = 7
    changed["grpo"]["seed"] = 1
    _, err, _ = _restore(changed, capsys)
    err = " ".join(err.split())  # rich may wrap the line
    assert "warning: resuming with changed policy.precision, data, grpo.seed" in err
    assert "policy.model_name" not in err
