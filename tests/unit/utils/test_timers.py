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
