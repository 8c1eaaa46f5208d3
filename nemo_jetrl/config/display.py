"""Compact rich rendering of a resolved config: one tree line per section, its scalar keys inline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from nemo_jetrl.config.errors import format_value


def config_tree(cfg: DictConfig | Mapping[str, Any], title: str = "config") -> Tree:
    """A rich Tree: each mapping is a node `name  key=value key=value ...`, nested mappings are children."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    tree = Tree(Text(title, style="bold"), guide_style="dim")
    _add_leaves(tree.label, data)
    _add_children(tree, data)
    return tree


def print_config(cfg: DictConfig | Mapping[str, Any], title: str = "config", console: Console | None = None) -> None:
    """Print `config_tree(cfg)` (to stdout unless a console is given)."""
    (console or Console()).print(config_tree(cfg, title))


def _add_children(node: Tree, data: Mapping[str, Any]) -> None:
    for key, value in data.items():
        if isinstance(value, Mapping):
            label = Text(str(key), style="bold cyan")
            _add_leaves(label, value)
            _add_children(node.add(label), value)


def _add_leaves(label: Text, data: Mapping[str, Any]) -> None:
    for key, value in data.items():
        if not isinstance(value, Mapping):
            label.append("  ")
            label.append(f"{key}=", style="dim")
            label.append(_render(value), style="green" if isinstance(value, str) else "magenta")


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value if value.strip() == value and value else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    return format_value(value, limit=200)
