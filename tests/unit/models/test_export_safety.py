"""Export never deletes or replaces a file it did not write (issue 14): unrelated files in --out survive, the base
model directory is never written to, an earlier export's stale shards go and nothing else does."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from nemo_jetrl.config import load_config
from nemo_jetrl.models.export import export_hf
from nemo_jetrl.models.export_dir import EXPORT_MARKER
from nemo_jetrl.models.loading import TINY_ARITH_DIR, load_model_and_tokenizer
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.checkpoint import CheckpointManager

REPO = Path(__file__).resolve().parents[3]


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model_and_tokenizer("tiny-arith")


def _unrelated(out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "notes.txt").write_text("keep me")
    (out / "config.json").write_text('{"mine": true}')
    (out / "model-extra.safetensors").write_bytes(b"someone else's weights")
    return _tree(out)


def test_unrelated_files_survive_with_and_without_overwrite(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    out = tmp_path / "out"
    before = _unrelated(out)
    with pytest.raises(ValueError, match="holds no earlier export"):
        export_hf(model, tok, out)
    assert _tree(out) == before
    export_hf(model, tok, out, overwrite=True)  # same-named config.json replaced (asked for), nothing removed
    after = _tree(out)
    assert after["notes.txt"] == before["notes.txt"]
    assert after["model-extra.safetensors"] == before["model-extra.safetensors"]
    written = json.loads((out / EXPORT_MARKER).read_text())["files"]
    assert "notes.txt" not in written and "model-extra.safetensors" not in written and "model.safetensors" in written


def test_re_export_removes_only_its_own_stale_shards(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    out = tmp_path / "out"
    export_hf(model, tok, out, max_shard_size="1MB")  # several shards
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1
    (out / "notes.txt").write_text("added by the user after the export")
    with pytest.raises(ValueError, match="max shard size"):
        export_hf(model, tok, out, max_shard_size="lots")  # refused before the disk is touched
    assert sorted(p.name for p in out.glob("model-*.safetensors")) == shards
    export_hf(model, tok, out)  # one shard now
    assert not list(out.glob("model-*.safetensors")) and (out / "model.safetensors").is_file()
    assert (out / "notes.txt").read_text() == "added by the user after the export"


def test_export_into_the_base_model_directory_is_refused(model_and_tokenizer, tmp_path, capsys):
    base = tmp_path / "base_model"  # a copy: a broken export must not damage the packaged model
    shutil.copytree(TINY_ARITH_DIR, base)
    before = _tree(base)
    cfg = validate_config(
        load_config(REPO / "examples" / "configs" / "grpo_tiny.yaml", [f"policy.model_name={base}"])
    ).model_dump()
    model, _ = model_and_tokenizer
    CheckpointManager(tmp_path / "ckpt").save(
        1, {"policy": {"model": model.state_dict(), "optimizer": {}, "step": 1}, "step": 1, "config": cfg}
    )
    spec = importlib.util.spec_from_file_location("export_hf_cli", REPO / "examples" / "export_hf.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    for out in (base, base / "sub", tmp_path / "ckpt"):
        assert cli.main(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: export directory") and "is inside the source" in err and err.count("\n") == 1
    assert _tree(base) == before
    assert not (base / "sub").exists()
    assert torch.load(tmp_path / "ckpt" / "step_1" / "state.pt", weights_only=True)["step"] == 1


def test_export_into_the_checkpoint_dir_of_a_step_is_refused(model_and_tokenizer, tmp_path, capsys):
    """Issue 46: `--checkpoint ckpt/step_1 --out ckpt` (or a directory inside ckpt) would write among the run's
    checkpoints; the whole checkpoint_dir is protected, not only the step directory."""
    model, _ = model_and_tokenizer
    cfg = validate_config(load_config(REPO / "examples" / "configs" / "grpo_tiny.yaml")).model_dump()
    ckpt = tmp_path / "ckpt"
    CheckpointManager(ckpt).save(
        1, {"policy": {"model": model.state_dict(), "optimizer": {}, "step": 1}, "step": 1, "config": cfg}
    )
    before = _tree(ckpt)
    spec = importlib.util.spec_from_file_location("export_hf_cli_46", REPO / "examples" / "export_hf.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    for out in (ckpt, ckpt / "exported"):
        assert cli.main(["--checkpoint", str(ckpt / "step_1"), "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: export directory") and f"is inside the source {ckpt}" in err, err
        assert err.count("\n") == 1
    assert _tree(ckpt) == before and sorted(p.name for p in ckpt.iterdir()) == ["step_1"]
