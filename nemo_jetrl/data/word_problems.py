"""Seeded arithmetic word problems with integer answers, written as jsonl for the math recipes (no download).

Each row is `{"problem": str, "answer": str, "expression": str}`: `answer` is the integer value of `expression`, and
`expression` holds the problem's numbers in the order the text gives them (`"17 + 25"`, `"40 - 3 * 4"`), so a test can
check every row without parsing English. Rows are unique; train and validation rows never share a problem.
"""

from __future__ import annotations

import ast
import json
import operator
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lena", "Omar", "Priya", "Sam")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells", "stamps", "cookies")
Row = dict[str, str]


def _add(rng: random.Random, name: str, item: str) -> tuple[str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", f"{a} + {b}"


def _sub(rng: random.Random, name: str, item: str) -> tuple[str, str]:
    b = rng.randint(2, 60)
    a = b + rng.randint(1, 60)
    return f"{name} had {a} {item} and gave away {b}. How many {item} does {name} have left?", f"{a} - {b}"


def _mul(rng: random.Random, name: str, item: str) -> tuple[str, str]:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"A box holds {a} {item}. How many {item} are in {b} boxes?", f"{a} * {b}"


def _div(rng: random.Random, name: str, item: str) -> tuple[str, str]:
    b, q = rng.randint(2, 9), rng.randint(2, 12)
    return f"{name} shares {b * q} {item} equally among {b} friends. How many {item} does each friend get?", (
        f"{b * q} // {b}"
    )


def _two_step(rng: random.Random, name: str, item: str) -> tuple[str, str]:
    b, c = rng.randint(2, 9), rng.randint(2, 5)
    a = b * c + rng.randint(1, 60)  # the answer stays positive
    return f"{name} has {a} {item} and gives {b} {item} to each of {c} friends. How many {item} are left?", (
        f"{a} - {b} * {c}"
    )


TEMPLATES: tuple[Callable[[random.Random, str, str], tuple[str, str]], ...] = (_add, _sub, _mul, _div, _two_step)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def evaluate(expression: str) -> int:
    """Integer value of an expression of ints and + - * // (no names, no calls); ValueError otherwise."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported expression {expression!r}")

    try:
        return walk(ast.parse(expression, mode="eval").body)
    except SyntaxError as err:
        raise ValueError(f"unsupported expression {expression!r}") from err


def generate_rows(n: int, seed: int, *, exclude: set[str] | frozenset[str] = frozenset()) -> list[Row]:
    """`n` unique rows from `seed`, none of whose problems is in `exclude`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"number of rows must be an int >= 0, got {n!r}")
    rng, rows, seen = random.Random(seed), [], set(exclude)
    for _ in range(200 * n + 1000):  # the templates hold tens of thousands of problems: never the limit in practice
        if len(rows) == n:
            return rows
        template = rng.choice(TEMPLATES)
        problem, expression = template(rng, rng.choice(NAMES), rng.choice(ITEMS))
        if problem not in seen:
            seen.add(problem)
            rows.append({"problem": problem, "answer": str(evaluate(expression)), "expression": expression})
    if len(rows) == n:
        return rows
    raise ValueError(f"could not draw {n} unique word problems (got {len(rows)}); ask for fewer rows")


def write_jsonl(rows: list[Row], path: Path) -> Path:
    """One JSON object per line; parent directories are created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_word_problem_splits(out_dir: Path, num_train: int, num_val: int, seed: int) -> tuple[Path, Path]:
    """`out_dir/train.jsonl` (`num_train` rows) and `out_dir/val.jsonl` (`num_val` rows, disjoint from train)."""
    if num_train < 1:
        raise ValueError(f"the training split needs at least one row, got {num_train}")
    train = generate_rows(num_train, seed)
    val = generate_rows(num_val, seed + 1, exclude={row["problem"] for row in train})
    return write_jsonl(train, out_dir / "train.jsonl"), write_jsonl(val, out_dir / "val.jsonl")
