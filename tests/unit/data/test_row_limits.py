"""Bad input rows that must cost nothing and be counted (issue 14): invalid UTF-8 is a bad row, not silently
replaced; a huge prompt is rejected without tokenizing it in full."""

from __future__ import annotations

import json
import warnings

import pytest

from nemo_jetrl.data import BadRowsWarning, DataSource, build_dataset_task, read_rows
from nemo_jetrl.data.dataset_task import MAX_CHARS_PER_TOKEN
from nemo_jetrl.environments.math_env import MathEnvironment

from .test_dataset_task import chat_tokenizer, data_cfg, write_rows


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_invalid_utf8_in_a_field_is_a_counted_bad_row(tmp_path, suffix):
    good = [json.dumps({"problem": f"p{i}", "answer": str(i)}).encode() for i in range(3)]
    broken = b'{"problem": "caf\xe9 \xff", "answer": "1"}'  # latin-1 bytes, not UTF-8
    escaped = json.dumps({"problem": "x", "answer": "\udc80"}).encode()  # a lone surrogate: no UTF-8 text either
    path = tmp_path / f"d{suffix}"
    if suffix == ".jsonl":
        path.write_bytes(b"\n".join([good[0], broken, good[1], escaped, good[2]]) + b"\n")
    else:
        path.write_bytes(b"[" + b",".join([good[0], broken, good[1], escaped, good[2]]) + b"]")
    rows, report = read_rows(DataSource(str(path), input_key="problem", output_key="answer"))
    assert [r[0] for r in rows] == ["p0", "p1", "p2"]
    assert report.skipped == {"invalid UTF-8 in 'problem'": 1, "invalid UTF-8 in 'answer'": 1}
    assert report.first_bad == {"invalid UTF-8 in 'problem'": 2, "invalid UTF-8 in 'answer'": 4}
    assert "1 invalid UTF-8 in 'problem' (row 2)" in report.summary()


class RecordingTokenizer:
    """The chat tokenizer, recording the longest text it was asked to tokenize."""

    def __init__(self) -> None:
        self.inner, self.longest = chat_tokenizer(), 0

    def __call__(self, texts, **kwargs):
        self.longest = max([self.longest, *(len(t) for t in (texts if isinstance(texts, list) else [texts]))])
        return self.inner(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_huge_prompt_is_rejected_without_full_tokenization(tmp_path):
    limit = 64
    huge = json.dumps({"problem": "7" * 5_000_000, "answer": "7"})  # 5 MB in one row
    path = write_rows(tmp_path / "d.jsonl", n=12, extra=[huge])
    tok = RecordingTokenizer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = build_dataset_task(data_cfg(path, max_input_seq_length=limit), MathEnvironment(), tokenizer=tok)
    assert len(task.train_problems) + len(task.val_problems) == 12
    assert tok.longest <= limit * MAX_CHARS_PER_TOKEN
    messages = [str(w.message) for w in caught if issubclass(w.category, BadRowsWarning)]
    assert messages and f"1 prompt longer than {limit} tokens (row 13)" in messages[0]
