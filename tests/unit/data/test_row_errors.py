"""Every per-row data error is a bad row counted with its file and line (issue 46): deeply nested brackets, a
5,000-digit number, a value Python cannot turn into text; the good rows are read and the run goes on."""

from __future__ import annotations

import json
import warnings

import pytest

from nemo_jetrl.data import DataSource, read_rows
from nemo_jetrl.data.config import DataConfig
from nemo_jetrl.data.dataset_task import BadRowsWarning, build_dataset_task

DEEP = "[" * 100_000 + "]" * 100_000
DIGITS = "7" * 5000


def _source(path) -> DataSource:
    return DataSource(str(path), input_key="problem", output_key="answer")


def _jsonl(path, lines: list[str]):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_deep_nesting_and_long_numbers_in_jsonl_are_rows_not_crashes(tmp_path):
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            json.dumps({"problem": "1+1?", "answer": "2"}),
            '{"problem": "deep?", "answer": ' + DEEP + "}",
            '{"problem": "big?", "answer": ' + DIGITS + "}",  # a JSON number of 5,000 digits
            json.dumps({"problem": "huge?", "answer": DIGITS}),  # the same as text
            json.dumps({"problem": "(" * 3000 + "x" + ")" * 3000, "answer": "1"}),
        ],
    )
    rows, report = read_rows(_source(path))
    assert [r[2] for r in rows] == [1, 3, 4, 5]
    assert rows[1][1] == DIGITS and rows[2][1] == DIGITS  # long numbers are kept exactly, as text
    assert dict(report.skipped) == {"JSON nested too deeply": 1} and report.first_bad["JSON nested too deeply"] == 2
    assert (
        report.summary() == f"1 of 5 rows of {path} skipped: 1 JSON nested too deeply (row 2)"
    )  # row = line of a .jsonl


def test_a_json_list_with_a_deep_element_keeps_the_others(tmp_path):
    path = tmp_path / "d.json"
    elements = [
        json.dumps({"problem": "a?", "answer": "1"}),
        '{"problem": "b?", "answer": ' + DEEP + "}",
        json.dumps({"problem": "c, [d]?", "answer": "3"}),  # commas and brackets inside strings are text
        '{"problem": "d?", "answer": ' + DIGITS + "}",
    ]
    path.write_text("[" + ",\n".join(elements) + "]")
    rows, report = read_rows(_source(path))
    assert [(r[0], r[2]) for r in rows] == [("a?", 1), ("c, [d]?", 3), ("d?", 4)] and rows[2][1] == DIGITS
    assert report.first_bad == {"JSON nested too deeply": 2}


def test_the_dataset_task_warns_naming_file_and_line(tmp_path):
    path = _jsonl(
        tmp_path / "train.jsonl",
        [json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)}) for i in range(6)]
        + ['{"problem": "deep?", "answer": ' + DEEP + "}"],
    )
    cfg = {
        "dataset_name": str(path),
        "val_dataset_name": None,
        "train_split": None,
        "val_split": None,
        "dataset_config": None,
        "input_key": "problem",
        "output_key": "answer",
        "prompt_template": "{}",
        "system_prompt": None,
        "use_chat_template": False,
        "max_input_seq_length": None,
        "seed": 0,
        "val_size": 2,
        "shuffle": False,
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = build_dataset_task(DataConfig(**cfg), scorer=None)
    assert len(task.train_problems) == 4 and len(task.val_problems) == 2
    (message,) = [str(w.message) for w in caught if issubclass(w.category, BadRowsWarning)]
    assert message == f"1 of 7 rows of {path} skipped: 1 JSON nested too deeply (row 7)"


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_file_of_only_bad_rows_is_one_error_naming_the_reasons(tmp_path, suffix):
    path = tmp_path / f"d{suffix}"
    row = '{"problem": "deep?", "answer": ' + DEEP + "}"
    path.write_text(row + "\n" if suffix == ".jsonl" else f"[{row}]")
    with pytest.raises(ValueError, match=rf"data source {path} has no usable row \(1 rows: 1 JSON nested too deeply\)"):
        read_rows(_source(path))
