"""Fixtures for the config tests: the repository root and the master config path."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def base_yaml(repo_root) -> Path:
    return repo_root / "examples" / "configs" / "grpo_base.yaml"
