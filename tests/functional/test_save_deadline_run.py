"""`checkpointing.checkpoint_must_save_by` through run_grpo (tiny model, CPU): a spent budget saves after the first
step and stops; the next run with the same checkpoint_dir continues, and the two together log exactly the metrics of
an uninterrupted run (timing keys excluded)."""

import json
from pathlib import Path

from nemo_jetrl.algorithms.grpo import run_grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.schema import validate_config

REPO = Path(__file__).resolve().parents[2]
RUN = [
    "grpo.max_num_steps=3",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=16",
    "grpo.val_period=0",
    "grpo.val_at_start=false",
    "logger.tensorboard_enabled=false",
    "checkpointing.enabled=true",
    "checkpointing.save_period=100",
]


def _cfg(root: Path, *extra: str):
    dirs = [f"logger.log_dir={root / 'logs'}", f"checkpointing.checkpoint_dir={root / 'ckpt'}"]
    return validate_config(load_config(REPO / "examples" / "configs" / "grpo_tiny.yaml", [*RUN, *dirs, *extra]))


def _metrics(root: Path) -> list[tuple[int, dict]]:
    rows = []
    for line in (root / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values = {k: v for k, v in record.items() if k != "step" and not k.startswith(("timing/", "memory/"))}
        if values:
            rows.append((record["step"], values))
    return rows


def test_a_spent_budget_saves_stops_and_the_next_run_continues_bitwise(tmp_path, capsys):
    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    run_grpo(_cfg(reference))
    first = run_grpo(_cfg(stopped, "++checkpointing.checkpoint_must_save_by='00:00:00:00'"))
    out = "".join(capsys.readouterr())
    assert len(first["history"]) == 1
    assert "checkpoint_must_save_by (00:00:00:00) reached after step 1: saved step 1" in out
    assert sorted(p.name for p in (stopped / "ckpt").glob("step_*")) == ["step_1"]
    second = run_grpo(_cfg(stopped))  # no budget: runs to max_num_steps from the saved step
    assert len(second["history"]) == 2
    assert sorted(p.name for p in (stopped / "ckpt").glob("step_*")) == ["step_1", "step_3"]
    assert [s for s, _ in _metrics(stopped)] == [1, 2, 3]
    assert _metrics(stopped) == _metrics(reference)  # exact float equality, every key
