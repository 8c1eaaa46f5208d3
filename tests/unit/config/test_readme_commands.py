"""Every `run_grpo.py` command the README shows validates as written (its config and overrides, in process): a
documented command that the schema refuses is a defect a user meets first (the BF16 example once overrode the
precisions of an FP8-KV config, which the schema refuses)."""

from __future__ import annotations

import shlex
from pathlib import Path

from nemo_jetrl.config import load_config
from nemo_jetrl.schema import validate_config

ROOT = Path(__file__).resolve().parents[3]
PREFIX = "uv run examples/run_grpo.py "


def readme_commands() -> list[list[str]]:
    """The README's `uv run examples/run_grpo.py ...` lines as argument lists (after the script)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    return [shlex.split(line.removeprefix(PREFIX)) for line in lines if line.startswith(PREFIX)]


def test_every_readme_grpo_command_validates():
    commands = readme_commands()
    assert len(commands) >= 4  # the main job and the examples
    for args in commands:
        assert args[0] == "--config", args
        overrides = [a for a in args[2:] if not a.startswith("--")]  # --validate-only: a flag, not an override
        cfg = validate_config(load_config(ROOT / args[1], overrides))
        assert cfg.grpo.max_num_steps >= 1, args
