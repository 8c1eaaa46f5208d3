"""read_rows: jsonl / json / parquet / datasets directories / HF names, bad rows counted, clear errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nemo_jetrl.data import DataSource, read_rows


def _source(path, **kwargs) -> DataSource:
    return DataSource(str(path), input_key=kwargs.pop("input_key", "problem"), output_key="answer", **kwargs)


def test_jsonl_counts_every_kind_of_bad_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"problem": "1+1?", "answer": "2"}),
                "{broken",
                "",  # blank lines are not rows
                json.dumps(["not", "an", "object"]),
                json.dumps({"problem": "2+2?"}),
                json.dumps({"problem": "3+3?", "answer": None}),
                json.dumps({"problem": "  ", "answer": "1"}),
                json.dumps({"problem": "x?", "answer": ["1"]}),
                json.dumps({"problem": "4+4?", "answer": 8, "extra": 1}),  # numbers become text
                json.dumps({"problem": "5+5?", "answer": " 10 "}),
            ]
        )
    )
    rows, report = read_rows(_source(path))
    assert rows == [("1+1?", "2", 1), ("4+4?", "8", 9), ("5+5?", "10", 10)]
    assert report.total == 9 and report.kept == 3
    assert dict(report.skipped) == {
        "malformed JSON": 1,
        "not a JSON object": 1,
        "missing 'answer'": 2,
        "empty 'problem'": 1,
        "non-text 'answer'": 1,
    }
    assert report.first_bad["missing 'answer'"] == 5
    assert report.summary().startswith(f"6 of 9 rows of {path} skipped: 1 empty 'problem' (row 7), ")


def test_json_list_and_parquet(tmp_path):
    rows = [{"q": "a?", "answer": "1"}, {"q": "b?", "answer": "2"}, {"q": "", "answer": "3"}]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("d.json", "d.parquet"):
        got, report = read_rows(_source(tmp_path / name, input_key="q"))
        assert got == [("a?", "1", 1), ("b?", "2", 2)] and dict(report.skipped) == {"empty 'q'": 1}, name


def test_missing_field_everywhere_names_the_fields_found(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"problem": "a", "solution": "1"}] * 3), tmp_path / "d.parquet")
    with pytest.raises(
        ValueError, match=r"no usable row \(3 rows: 3 missing 'answer'\); fields found: \['problem', 'solution'\]"
    ):
        read_rows(_source(tmp_path / "d.parquet"))


def test_all_rows_malformed_is_an_error(tmp_path):
    (tmp_path / "d.jsonl").write_text("{x\n{y\n")
    with pytest.raises(ValueError, match=r"no usable row \(2 rows: 2 malformed JSON\)"):
        read_rows(_source(tmp_path / "d.jsonl"))


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(ValueError, match=r"data.dataset_name='.*nope.jsonl': data file does not exist"):
        read_rows(_source(tmp_path / "nope.jsonl"))
    with pytest.raises(
        ValueError, match=r"data.val_dataset_name='no-such/dataset' is neither .* offline HF datasets cache"
    ):
        read_rows(DataSource("no-such/dataset", "problem", "answer", config_key="data.val_dataset_name"))


def test_datasets_save_to_disk_directory_with_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"problem": "a", "answer": "1"}, {"problem": "b", "answer": ""}]),
            "test": datasets.Dataset.from_list([{"problem": "c", "answer": "3"}]),
        }
    )
    dd.save_to_disk(tmp_path / "dd")
    rows, report = read_rows(_source(tmp_path / "dd"))
    assert rows == [("a", "1", 1)] and dict(report.skipped) == {"empty 'answer'": 1}
    assert read_rows(_source(tmp_path / "dd", split="test"))[0] == [("c", "3", 1)]
    with pytest.raises(ValueError, match=r"split 'validation' not found; available splits: \['train', 'test'\]"):
        read_rows(_source(tmp_path / "dd", split="validation"))


def test_empty_key_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="data.input_key must be a non-empty field name"):
        read_rows(DataSource(str(tmp_path / "d.jsonl"), "", "answer"))
