"""Evaluation of a checkpoint or HF model directory on a task's held-out prompts (examples/run_eval.py)."""
