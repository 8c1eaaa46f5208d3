"""CPU process settings: the thread count reaches torch, and glibc keeps freed blocks (no page faults on reuse)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from nemo_jetrl.utils.cpu_runtime import configure_cpu_process

# 20 blocks of 1 MiB allocated and freed per round (the FP8 emulation's temporaries are of this size); prints the
# minor page faults of the last 10 rounds. Both arms first pin glibc's static default thresholds (128 KiB, no
# dynamic adjustment), so the baseline does not depend on what the imports allocated; "keep" then applies ours.
_ROUNDS = """
import ctypes, ctypes.util, resource, sys, torch
from nemo_jetrl.utils.cpu_runtime import keep_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
assert libc.mallopt(-3, 128 * 1024) and libc.mallopt(-1, 128 * 1024)  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def round_():
    blocks = [torch.empty(1 << 18).fill_(1.0) for _ in range(20)]
    del blocks
for _ in range(3):
    round_()
start = faults()
for _ in range(10):
    round_()
print(faults() - start)
"""

def test_thread_count_reaches_torch():
    before = torch.get_num_threads()
    try:
        configure_cpu_process(1, cpu_compute=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_freed_blocks_are_reused_without_page_faults():
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.strip())

    default, kept = faults("default"), faults("keep")
    assert default > 10 * 20 * 200  # each 1 MiB block is mmapped and faulted in again (256 pages of 4 KiB)
    assert kept < 100, (kept, default)
