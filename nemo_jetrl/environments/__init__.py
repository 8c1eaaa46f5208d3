"""Verifiable tasks: prompts, held-out sets and rewards computed from decoded text."""

from nemo_jetrl.environments.arithmetic import ArithmeticTask
from nemo_jetrl.environments.factory import KNOWN_TASKS, make_task
from nemo_jetrl.environments.interfaces import Problem, VerifiableTask

__all__ = ["KNOWN_TASKS", "ArithmeticTask", "Problem", "VerifiableTask", "make_task"]
