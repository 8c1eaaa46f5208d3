"""`--sft-init-from`: an SFT that starts from a finished shorter one's weights (a curriculum, e.g. 4k from 2k),
recorded in its metadata, handed to each seed's SFT process with its own seed, and refused by name before any SFT
starts when the source is missing, did not pass its gate or trained another shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import accuracy_study as study  # noqa: E402

CPU = torch.device("cpu")


def _sft(out: Path, num_digits: int, **kw) -> dict:
    settings = dict(study.QUICK_LONG_SFT, num_digits=num_digits, max_time_s=600.0) | kw
    return study.accuracy_sft.run_sft(out, seed=0, data_seed=1234, device=CPU, **settings)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A passed 2-digit quick SFT (gate 0: any model passes) of two steps."""
    out = tmp_path_factory.mktemp("src") / "sft"
    meta = _sft(out, 2)
    assert meta["gate_passed"] and meta["steps"] == 2 and meta["init_from"] is None
    return out


def test_an_sft_starts_from_the_source_weights_and_records_it(source, tmp_path):
    """Zero steps of a 3-digit SFT from the 2-digit one: the saved weights are the source's to the bit (a fresh
    start's are not), the longer task widens the position limit, and the metadata names the source."""
    meta = _sft(tmp_path / "cur", 3, init_from=source, max_new_steps=0)
    fresh = _sft(tmp_path / "fresh", 3, max_new_steps=0)
    src, cur, new = (load_file(d / "model.safetensors") for d in (source, tmp_path / "cur", tmp_path / "fresh"))
    assert src.keys() == cur.keys() and all(torch.equal(src[k], cur[k]) for k in src)
    assert not all(torch.equal(src[k], new[k]) for k in src) and fresh["init_from"] is None
    assert meta["init_from"] == {"path": str(source), "num_digits": 2, "steps": 2,
                                 "gate_greedy_accuracy": json.loads((source / "sft_meta.json").read_text())[
                                     "gate_greedy_accuracy"]}  # fmt: skip
    assert meta["max_positions"] > json.loads((source / "sft_meta.json").read_text())["max_positions"]
    # and it trains on from there: one step moves the weights off the source's
    _sft(tmp_path / "cur1", 3, init_from=source, max_new_steps=1)
    one = load_file(tmp_path / "cur1" / "model.safetensors")
    assert not all(torch.equal(src[k], one[k]) for k in src)


def test_an_unfit_source_is_refused_by_name(source, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"--sft-init-from {missing}: no sft_meta.json there"):
        study.accuracy_sft.init_source(missing, "long_multiplication", "quick")
    with pytest.raises(ValueError, match="trained long_multiplication on the 'quick' shape, this SFT "
                                         "long_multiplication on 'long'"):  # fmt: skip
        study.accuracy_sft.init_source(source, "long_multiplication", "long")
    failed = tmp_path / "failed"
    failed.mkdir()
    meta = json.loads((source / "sft_meta.json").read_text())
    (failed / "sft_meta.json").write_text(json.dumps({**meta, "gate_passed": False}))
    with pytest.raises(ValueError, match="that SFT did not pass its gate \\(2 steps\\)"):
        study.accuracy_sft.init_source(failed, "long_multiplication", "quick")


def test_the_flag_reaches_each_seeds_sft_with_its_seed_and_a_bad_source_stops_the_stage(
    source, tmp_path, monkeypatch, capsys
):
    template = str(source).replace("src0", "src{seed}")  # the fixture's directory is .../src0/sft
    assert "{seed}" in template
    parse = study.build_parser().parse_args
    stage = parse(["stage", "--study", "long", "--quick", "--sft-init-from", template, "--out", str(tmp_path)])
    argv = study.sft_argv(study.seed_args(stage, tmp_path / "quick", 0))
    assert f"--sft-init-from={template}" in argv
    seen = {}
    monkeypatch.setattr(study.accuracy_sft, "run_sft", lambda out, **kw: seen.update(kw) or {
        "steps": 0, "gate_greedy_accuracy": None, "gate": 0, "num_parameters": 0, "wall_time_s": 0})  # fmt: skip
    study.stage_sft(parse(argv))
    assert seen["init_from"] == Path(template.format(seed=0)) == source
    rc = study.main(["stage", "--study", "long", "--quick", "--seeds", "1", "--sft-init-from", template,
                     "--out", str(tmp_path / "stage")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"error: --sft-init-from {template.format(seed=1)}: no sft_meta.json there "
                               "(not a finished SFT)"]  # fmt: skip
    assert not (tmp_path / "stage" / "quick").exists()  # nothing started
