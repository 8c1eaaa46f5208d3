"""The keys NeMo-RL defines at the pinned commit (nemo_rl_defined_keys.txt, written by tools/nemo_rl_snapshot.py) and
the subtrees that only NeMo-RL has.

A NeMo-RL-only subtree is a mapping NeMo-RL defines directly below one of our sections (or at the top) that our
schema does not have (`policy.megatron_cfg`, `policy.generation.vllm_cfg`, `data_plane`, ...): a key below it that is
newer than the pinned commit is NeMo-RL's by construction, so it is ignored with one warning line. A key directly in
one of our sections that neither we nor NeMo-RL define stays an error (a typo; the error suggests the near key).
"""

from __future__ import annotations

import functools
from pathlib import Path

FACTS_FILE = Path(__file__).with_name("nemo_rl_defined_keys.txt")


@functools.cache
def _facts() -> tuple[str, frozenset[str], tuple[str, ...]]:
    """(pinned commit, keys, open prefixes: every key below `p.` is NeMo-RL's)."""
    lines = FACTS_FILE.read_text().splitlines()
    commit = lines[0].split(" at ", 1)[1].split(")", 1)[0]
    keys = [line for line in lines if line and not line.startswith("#")]
    return commit, frozenset(k for k in keys if not k.endswith(".*")), tuple(k[:-2] for k in keys if k.endswith(".*"))


def pinned_commit() -> str:
    return _facts()[0]


def defined_keys() -> tuple[frozenset[str], tuple[str, ...]]:
    """(every key NeMo-RL defines, the open mappings among them)."""
    return _facts()[1], _facts()[2]


def nemo_rl_defines(key: str, *, through_open: bool = True) -> bool:
    """Whether NeMo-RL (at the pinned commit) defines `key`; `through_open`: also as a key below an open mapping."""
    _, keys, opens = _facts()
    return key in keys or (through_open and any(key.startswith(prefix + ".") for prefix in opens))


@functools.cache
def _children() -> frozenset[str]:
    _, keys, opens = _facts()
    return frozenset(k.rpartition(".")[0] for k in keys if "." in k) | frozenset(opens)


def is_nemo_rl_mapping(key: str) -> bool:
    """Whether NeMo-RL defines keys below `key` (a section, possibly written `null`)."""
    return key in _children()


def nemo_rl_only_subtrees(is_our_section, is_our_field) -> list[str]:
    """NeMo-RL's mappings whose parent is one of our sections (or the top) and that our schema does not have."""
    out = []
    for key in sorted(_children()):
        parent = key.rpartition(".")[0]
        if (not parent or is_our_section(parent)) and not is_our_field(key):
            out.append(key)
    return out
