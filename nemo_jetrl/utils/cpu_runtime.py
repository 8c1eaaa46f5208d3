"""Process settings for CPU training and rollout: thread count and an allocator that keeps freed memory.

glibc returns freed blocks above its mmap / trim thresholds to the OS, so each large temporary of the FP8 emulation
(quantized operands, dequantized copies) is page-faulted in afresh on every use. Raising the thresholds keeps those
blocks in the heap for reuse; the process's resident memory then stays at its peak instead of shrinking.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
_TRIM_THRESHOLD = 1 << 30


def configure_cpu_process(num_threads: int | None, *, cpu_compute: bool) -> None:
    """`torch.set_num_threads(num_threads)` when given; with `cpu_compute`, keep freed heap memory (glibc only)."""
    if num_threads:
        torch.set_num_threads(int(num_threads))
    if cpu_compute:
        keep_freed_memory()


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; False where there is no glibc mallopt."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    if not ok:
        logger.debug("mallopt refused the thresholds; the allocator keeps its defaults")
    return ok
