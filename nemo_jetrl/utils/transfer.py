"""Host -> device copies that do not sync the host with the device."""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`. Host -> CUDA goes through pinned memory with `non_blocking` (a pageable copy waits for the
    device, which drains the launch queue); the caching host allocator keeps the pinned source alive until the
    copy ran. Other moves are plain `.to`."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
