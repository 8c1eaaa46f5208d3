"""nemo-jetrl: on-policy FP8 RL for LLMs (Jet-RL unified precision flow)."""

__version__ = "0.1.0"
