"""Rollout engines behind one interface (native now), in the shared sequence layout."""

from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput

__all__ = ["GenerationInterface", "GenerationOutput"]
