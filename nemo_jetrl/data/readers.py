"""Read (prompt, answer) rows from a data source, counting bad rows instead of failing on them.

Sources (`data.dataset_name` / `data.val_dataset_name`):
- a `.jsonl` file (one JSON object per line; blank lines ignored), a `.json` file (a list of objects, or JSON lines),
- a `.parquet` file,
- a local directory: written by `datasets`' `save_to_disk` (Dataset or DatasetDict), or holding data files
  (`datasets.load_dataset(dir)`),
- a HF datasets name, read from the local cache only: it needs `HF_HUB_OFFLINE=1` (this project never downloads).

A row is kept when both fields exist and are non-empty text (numbers are turned into text: GSM8K-style integer
answers are fine, and a JSON integer of thousands of digits is kept as its digits). Every other row is counted
under one reason (`malformed JSON`, `JSON nested too deeply`, `not a JSON object`, `missing 'answer'`,
`empty 'problem'`, `non-text 'answer'`, `invalid UTF-8 in 'problem'`) with its first row number (the line of a
.jsonl, the element of a .json list, the row of a table) in a `RowReport`, whose summary names the file: no row
ends the run. A source with no usable row is an error that names the fields it does
have.
"""

from __future__ import annotations

import json
import numbers
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
# bytes that are not UTF-8 decode (errors="surrogateescape") to lone surrogates; JSON "\\udXXX" escapes give them too
_NOT_UTF8 = re.compile("[\ud800-\udfff]")
_MAX_INT_DIGITS = 4000  # below Python's int <-> str conversion limit (4300 digits); longer JSON integers stay text
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')  # strings (skipped whole), brackets, commas


@dataclass
class RowReport:
    """What reading one source kept and skipped."""

    source: str
    total: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    first_bad: dict[str, int] = field(default_factory=dict)  # reason -> first row (1-based line / row number)
    fields_seen: list[str] = field(default_factory=list)  # keys of the first object (for error messages)

    def skip(self, reason: str, row_number: int) -> None:
        self.skipped[reason] += 1
        self.first_bad.setdefault(reason, row_number)

    def summary(self) -> str:
        """`3 of 12 rows of train.jsonl skipped: 1 malformed JSON (row 4), 2 missing 'answer' (row 2)`."""
        parts = [f"{n} {reason} (row {self.first_bad[reason]})" for reason, n in sorted(self.skipped.items())]
        return f"{sum(self.skipped.values())} of {self.total} rows of {self.source} skipped: " + ", ".join(parts)


@dataclass(frozen=True)
class DataSource:
    """Where rows come from and which fields hold the prompt and the reference answer."""

    name: str  # file path, directory or HF datasets name
    input_key: str
    output_key: str
    split: str | None = None  # for DatasetDicts / HF datasets
    config_name: str | None = None  # HF datasets config (subset)
    config_key: str = "data.dataset_name"  # the config key that named it (for error messages)


def _as_text(value: Any) -> str | None:
    """Text of a field value: strings stripped, real numbers via str(); None for anything else (lists, dicts, bools)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return str(value)


def _parse_int(digits: str) -> int | str:
    return int(digits) if len(digits.lstrip("-")) <= _MAX_INT_DIGITS else digits


def _loads_row(text: str) -> tuple[Any, str | None]:
    """(object, None), or (None, the bad-row reason) for text that is not one JSON value this reader can hold."""
    try:
        return json.loads(text, parse_int=_parse_int), None
    except RecursionError:
        return None, "JSON nested too deeply"
    except ValueError:  # JSONDecodeError included
        return None, "malformed JSON"


def _take_row(obj: Any, source: DataSource, report: RowReport, row_number: int) -> tuple[str, str, int] | None:
    report.total += 1
    if not isinstance(obj, Mapping):
        report.skip("not a JSON object", row_number)
        return None
    if not report.fields_seen:
        report.fields_seen = [str(k) for k in obj]
    texts = []
    for key in (source.input_key, source.output_key):
        if key not in obj or obj[key] is None:
            report.skip(f"missing '{key}'", row_number)
            return None
        text = _as_text(obj[key])
        if text is None:
            report.skip(f"non-text '{key}'", row_number)
            return None
        if not text.strip():
            report.skip(f"empty '{key}'", row_number)
            return None
        if _NOT_UTF8.search(text):
            report.skip(f"invalid UTF-8 in '{key}'", row_number)
            return None
        texts.append(text)
    report.kept += 1
    return texts[0], texts[1].strip(), row_number


def _rows_from_objects(objects: Iterable[tuple[int, Any]], source: DataSource, report: RowReport) -> list:
    rows = []
    for row_number, obj in objects:
        row = _take_row(obj, source, report, row_number)
        if row is not None:
            rows.append(row)
    return rows


def _read_jsonl(path: Path, source: DataSource, report: RowReport) -> list[tuple[str, str, int]]:
    rows = []
    with path.open(encoding="utf-8", errors="surrogateescape") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            obj, problem = _loads_row(line)
            if problem is not None:
                report.total += 1
                report.skip(problem, line_number)
                continue
            row = _take_row(obj, source, report, line_number)
            if row is not None:
                rows.append(row)
    return rows


def _list_elements(text: str) -> Iterator[str] | None:
    """Source text of each top-level element of a JSON array (strings and brackets matched, nothing parsed), or
    None when `text` is not one: each element can then be parsed and counted on its own."""
    if not text.lstrip().startswith("["):
        return None

    def elements() -> Iterator[str]:
        depth, start = 0, 0
        for token in _JSON_TOKENS.finditer(text):
            mark = token.group()
            if mark in "[{":
                depth += 1
                start = token.end() if depth == 1 else start
            elif mark in "]}":
                depth -= 1
                if depth == 0:
                    if text[start : token.start()].strip():
                        yield text[start : token.start()]
                    return
            elif mark == "," and depth == 1:
                yield text[start : token.start()]
                start = token.end()

    return elements()


def _read_json(path: Path, source: DataSource, report: RowReport) -> list[tuple[str, str, int]]:
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    try:
        data = json.loads(text, parse_int=_parse_int)
    except RecursionError:  # one element nested too deeply: read the list element by element
        elements = _list_elements(text)
        if elements is None:
            raise ValueError(f"{source.name}: JSON nested too deeply (and not a list of rows)") from None
        parsed = []
        for number, element in enumerate(elements, start=1):
            obj, problem = _loads_row(element)
            if problem is None:
                parsed.append((number, obj))
            else:
                report.total += 1
                report.skip(problem, number)
        return _rows_from_objects(parsed, source, report)
    except json.JSONDecodeError:
        return _read_jsonl(path, source, report)  # JSON lines saved as .json
    if isinstance(data, Mapping):  # {"data": [...]} or a single split
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else [data]
    if not isinstance(data, list):
        raise ValueError(f"{source.name}: a .json data file must hold a list of objects, got {type(data).__name__}")
    return _rows_from_objects(enumerate(data, start=1), source, report)


def _read_parquet(path: Path, source: DataSource, report: RowReport) -> list[tuple[str, str, int]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise ValueError(f"{source.name}: cannot read parquet file ({type(err).__name__}: {err})") from err
    return _rows_from_columns(
        table.column_names, lambda key: table.column(key).to_pylist(), table.num_rows, source, report
    )


def _rows_from_columns(columns: list[str], get_column, num_rows: int, source: DataSource, report: RowReport) -> list:
    """Rows of a columnar table; a missing column makes every row `missing '<key>'`."""
    report.fields_seen = list(columns)
    keys = (source.input_key, source.output_key)
    data = {key: get_column(key) if key in columns else [None] * num_rows for key in keys}
    objects = ((i + 1, {k: data[k][i] for k in keys if k in columns}) for i in range(num_rows))
    return _rows_from_objects(objects, source, report)


def _hf_split(dataset: Any, source: DataSource) -> Any:
    """One split of a DatasetDict (the configured one, else `train`, else the only one)."""
    if not hasattr(dataset, "keys"):  # already a Dataset
        return dataset
    names = list(dataset.keys())
    split = source.split or ("train" if "train" in names else (names[0] if len(names) == 1 else None))
    if split not in names:
        raise ValueError(f"{source.name}: split {source.split!r} not found; available splits: {names}")
    return dataset[split]


def _read_hf(source: DataSource, report: RowReport) -> list[tuple[str, str, int]]:
    import datasets

    path = Path(source.name).expanduser()
    try:
        if path.is_dir() and any(
            (path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json", "state.json")
        ):
            dataset = _hf_split(datasets.load_from_disk(str(path)), source)
        elif path.is_dir():
            dataset = _hf_split(datasets.load_dataset(str(path), source.config_name), source)
        else:
            if not datasets.config.HF_HUB_OFFLINE:
                raise ValueError(
                    f"{source.config_key}={source.name!r} is not a local file or directory; HF dataset names are "
                    "read from the local cache only: set HF_HUB_OFFLINE=1 (and download the dataset beforehand) "
                    "or pass a local path"
                )
            dataset = _hf_split(datasets.load_dataset(source.name, source.config_name, split=source.split), source)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many types (FileNotFoundError, ConnectionError, ...)
        first_line = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(
            f"{source.config_key}={source.name!r} is neither the builtin task 'arithmetic', a local data file or "
            f"directory, nor a dataset in the offline HF datasets cache ({type(err).__name__}: {first_line})"
        ) from err
    return _rows_from_columns(dataset.column_names, lambda key: dataset[key], len(dataset), source, report)


def read_rows(source: DataSource) -> tuple[list[tuple[str, str, int]], RowReport]:
    """All usable (prompt, answer, row number) rows of `source` in source order, and the report of what was skipped.

    Raises ValueError when the source cannot be read or holds no usable row.
    """
    for key_name, key in (("input_key", source.input_key), ("output_key", source.output_key)):
        if not isinstance(key, str) or not key:
            raise ValueError(f"data.{key_name} must be a non-empty field name, got {key!r}")
    report = RowReport(source=source.name)
    path = Path(source.name).expanduser()
    suffix = path.suffix.lower()
    if suffix in FILE_SUFFIXES:
        if not path.is_file():
            raise ValueError(f"{source.config_key}={source.name!r}: data file does not exist")
        reader = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}[suffix]
        rows = reader(path, source, report)
    else:
        rows = _read_hf(source, report)
    if not rows:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items())) or "it is empty"
        fields = f"; fields found: {report.fields_seen}" if report.fields_seen else ""
        raise ValueError(
            f"data source {source.name} has no usable row ({report.total} rows: {counts}){fields}; "
            f"data.input_key={source.input_key!r}, data.output_key={source.output_key!r}"
        )
    return rows, report
