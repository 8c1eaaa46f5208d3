"""Shared test helpers (not collected by pytest): a scripted GRPO task + batch checks, an independent trainer step.

`tests/conftest.py` puts `tests/` on sys.path, so test modules `from jetrl_testkit import grpo_harness`.
"""
