"""trace_gaps: the device's idle gaps in a profiler trace, charged to the host ops that ran in them."""

import gzip
import json

from benchmarks import trace_gaps


def _trace(tmp_path, gz: bool):
    events = [
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 30, "dur": 10},  # gap 10..30 (20 us)
        {"ph": "X", "cat": "gpu_memset", "name": "m", "ts": 38, "dur": 5},  # overlaps k2: one busy span 30..43
        {"ph": "X", "cat": "kernel", "name": "k3", "ts": 50, "dur": 10},  # gap 43..50 (7 us)
        {"ph": "X", "cat": "kernel", "name": "k4", "ts": 62, "dur": 8},  # gap 60..62 (2 us: below the minimum)
        {"ph": "X", "cat": "cpu_op", "name": "aten::foo", "ts": 5, "dur": 30},  # overlaps the first gap: 20 us
        {"ph": "X", "cat": "cpu_op", "name": "aten::bar", "ts": 44, "dur": 3},  # inside the second gap: 3 us
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 44, "dur": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaFree", "ts": 12, "dur": 4},  # the allocator in gap 1
        {"ph": "X", "cat": "cuda_driver", "name": "cuMemMap", "ts": 28, "dur": 4},  # 2 of its 4 us in gap 1
        {"ph": "X", "cat": "python_function", "name": "torch/nn/x.py(1): f", "ts": 11, "dur": 2},  # not charged
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1},  # not a duration event: ignored
    ]
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    with (gzip.open if gz else open)(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def test_gaps_busy_time_and_host_ops(tmp_path):
    for gz in (False, True):
        out = trace_gaps.report(_trace(tmp_path, gz), min_gap_us=5.0)
        assert out["gaps"] == 2
        assert abs(out["idle_ms"] - 0.027) < 1e-9  # 20 + 7 us
        assert abs(out["busy_ms"] - (10 + 13 + 10 + 8) / 1e3) < 1e-9
        assert abs(out["span_ms"] - 0.070) < 1e-9
        assert abs(out["after_sync_ms"] - 0.007) < 1e-9  # the sync overlaps the second gap only
        assert out["sync_calls"] == 1  # `sync_calls`: the one host wait
        assert abs(out["in_allocator_ms"] - 0.020) < 1e-9  # cudaFree and cuMemMap overlap the first gap only
        assert out["top_ops_ms"] == {"aten::foo": 0.020, "aten::bar": 0.003}  # ms per op name
        assert out["top_runtime_ms"] == {"cudaFree": 0.004, "cudaStreamSynchronize": 0.002, "cuMemMap": 0.002}


def test_a_trace_without_device_events(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]))
    out = trace_gaps.report(str(path))
    assert out["gaps"] == 0 and out["idle_ms"] == 0.0 and out["busy_ms"] == 0.0


def test_sync_calls_count_the_host_waits_only(tmp_path):
    """A blocking wait for the device counts; launches, copies queued without a wait and host ops do not."""
    events = trace_gaps.load_events(_trace(tmp_path, False))
    assert trace_gaps.sync_calls(events) == 1
    more = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 70, "dur": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 71, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "cudaStreamSynchronize", "ts": 72, "dur": 1},  # not a runtime call
    ]
    assert trace_gaps.sync_calls(events + more) == 2
