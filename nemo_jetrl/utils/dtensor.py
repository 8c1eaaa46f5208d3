"""The two views of a possibly sharded tensor (a DTensor under FSDP2 / tensor parallel, else a plain tensor)."""

from __future__ import annotations

from typing import Any

import torch


def local_tensor(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's shard of a DTensor (differentiable), else `t` itself (plain tensors, None)."""
    return t.to_local() if hasattr(t, "to_local") else t


def full_tensor(t: Any) -> Any:
    """The whole tensor a DTensor shards (collective: every rank of its mesh calls it), else `t` itself (plain
    tensors and non-tensors)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
