"""Timer: accumulated sleeps, nested names, reductions, reset, errors."""

import time

import pytest
import torch

from nemo_jetrl.utils.timers import Timer

SLACK = 0.25  # generous upper slack for a loaded 2-core CI machine; sleeps never undershoot


def test_accumulates_known_sleeps_with_nested_names():
    timer = Timer()
    for _ in range(2):
        with timer.time("train"):
            time.sleep(0.02)
            with timer.time("train/optimizer"):
                time.sleep(0.03)
    with timer.time("generation"):
        time.sleep(0.04)
    total = timer.get_timing_metrics()
    assert set(total) == {"timing/train", "timing/train/optimizer", "timing/generation"}
    assert 0.10 <= total["timing/train"] < 0.10 + SLACK
    assert 0.06 <= total["timing/train/optimizer"] < 0.06 + SLACK
    assert 0.04 <= total["timing/generation"] < 0.04 + SLACK
    assert total["timing/train"] > total["timing/train/optimizer"]
    means = timer.get_timing_metrics("mean")
    assert 0.05 <= means["timing/train"] < 0.05 + SLACK
    assert timer.get_timing_metrics("count") == {
        "timing/train": 2.0,
        "timing/train/optimizer": 2.0,
        "timing/generation": 1.0,
    }
    assert len(timer.durations("train")) == 2 and timer.durations("nothing") == []


def test_reset_and_start_stop():
    timer = Timer()
    timer.start("a")
    elapsed = timer.stop("a")
    assert timer.get_timing_metrics() == {"timing/a": elapsed}
    timer.reset("a")
    assert timer.get_timing_metrics() == {}
    with timer.time("b"):
        pass
    timer.reset()
    assert timer.get_timing_metrics() == {}


def test_interval_recorded_when_body_raises():
    timer = Timer()
    with pytest.raises(KeyError), timer.time("x"):
        raise KeyError("boom")
    assert timer.get_timing_metrics("count") == {"timing/x": 1.0}


def test_errors_name_the_problem():
    timer = Timer()
    with pytest.raises(ValueError, match="'a' was not started"):
        timer.stop("a")
    timer.start("a")
    with pytest.raises(ValueError, match="'a' is already running"):
        timer.start("a")
    with pytest.raises(ValueError, match="unknown timer reduction 'median'"):
        timer.get_timing_metrics("median")
    with pytest.raises(ValueError, match="non-empty string"):
        timer.start("")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_device_without_cuda_is_refused():
    with pytest.raises(ValueError, match="CUDA is not available"):
        Timer(device="cuda")
    assert Timer(device="cpu").device == torch.device("cpu")


def test_memory_peaks_are_recorded_on_cuda_only():
    timer = Timer(memory_device="cpu")  # a CPU run: timings as ever, no memory metric
    with timer.time("training"):
        pass
    assert timer.memory_device is None and timer.get_memory_metrics() == {}
    assert list(timer.get_timing_metrics()) == ["timing/training"]


class FakeAllocator:
    """torch.cuda's allocator counters, driven by hand: `alloc` / `free` bytes, `cache` (reserved, not allocated)."""

    def __init__(self, monkeypatch):
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = self.retries = 0
        self.segments: list[dict] = []  # torch.cuda.memory_snapshot()'s segments (device 0)
        for name, fn in {
            "memory_snapshot": lambda *a, **k: list(self.segments),
            "current_device": lambda: 0,
            "memory_allocated": lambda d=None: self.allocated,
            "memory_reserved": lambda d=None: self.reserved,
            "max_memory_allocated": lambda d=None: self.peak_allocated,
            "max_memory_reserved": lambda d=None: self.peak_reserved,
            "reset_peak_memory_stats": lambda d=None: self.reset(),
            "memory_stats": lambda d=None: {"num_alloc_retries": self.retries},
        }.items():
            monkeypatch.setattr(torch.cuda, name, fn)

    def reset(self):
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def alloc(self, n: int, cached: int = 0):
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated + cached)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n: int, release: bool = False):
        self.allocated -= n
        if release:  # empty_cache
            self.reserved = self.allocated


def test_allocated_and_reserved_peaks_per_phase_nested_included(monkeypatch):
    gib = 1024**3
    fake = FakeAllocator(monkeypatch)
    timer = Timer(memory_device="cuda")
    with timer.time("total_step_time"):
        with timer.time("generation"):
            fake.alloc(10 * gib, cached=4 * gib)  # the KV pool, and 4 GiB the allocator keeps cached
            fake.free(10 * gib)  # freed, still reserved
            graphs = {"device": 0, "segment_pool_id": (1, 0), "total_size": 3 * gib, "allocated_size": gib}
            other_device = {**graphs, "device": 1}
            default_pool = {"device": 0, "segment_pool_id": (0, 0), "total_size": 4 * gib, "allocated_size": 0}
            fake.segments = [graphs, other_device, default_pool]  # decode graphs: 2 GiB of their pool free
        with timer.time("training"):
            fake.alloc(6 * gib)
            fake.retries += 2  # the allocator freed its cache and retried twice
            fake.free(6 * gib, release=True)
    m = timer.get_memory_metrics()
    assert m["memory/generation_peak_gib"] == 10 and m["memory/generation_reserved_peak_gib"] == 14
    assert m["memory/training_peak_gib"] == 6 and m["memory/training_reserved_peak_gib"] == 14  # the cache stayed
    assert m["memory/total_step_time_peak_gib"] == 10 and m["memory/total_step_time_reserved_peak_gib"] == 14
    assert m["memory/generation_graph_pool_gib"] == 2 and m["memory/training_graph_pool_gib"] == 2  # still captured
    assert m["memory/generation_alloc_retries"] == 0 and m["memory/training_alloc_retries"] == 2
    assert m["memory/total_step_time_alloc_retries"] == 2  # nested phases' retries count in the outer one
    fake.segments = []  # the graphs released
    timer.reset()
    with timer.time("training"):  # after the release: the footprint is the phase's own
        fake.alloc(6 * gib)
    assert timer.get_memory_metrics() == {
        "memory/training_peak_gib": 6,
        "memory/training_reserved_peak_gib": 6,
        "memory/training_graph_pool_gib": 0,
        "memory/training_alloc_retries": 0,  # the retries before the reset are not this phase's
    }


def test_added_intervals_reduce_with_the_timed_ones():
    timer = Timer()
    timer.add("generation/cuda_graph_capture", 0.25)
    timer.add("generation/cuda_graph_capture", 0.5)
    assert timer.durations("generation/cuda_graph_capture") == [0.25, 0.5]
    assert timer.get_timing_metrics()["timing/generation/cuda_graph_capture"] == 0.75
    assert timer.get_timing_metrics("max")["timing/generation/cuda_graph_capture"] == 0.5
