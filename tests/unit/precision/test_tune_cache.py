"""Timed kernel picks shared on disk (precision/kernels/tune_cache.py): one process times a shape, every other
process of the machine reads its pick; `off` times in each; a torn file is timed afresh; a run records its picks."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from nemo_jetrl.precision.kernels import tune_cache


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(tune_cache, "_used", {})
    monkeypatch.setattr(tune_cache, "_recorded", {})
    monkeypatch.setattr(tune_cache, "_unusable", set())


def _pick_in_process(cache: str, timed_log: str, out: mp.Queue) -> None:
    import os

    os.environ[tune_cache.ENV] = cache

    def tune():
        with open(timed_log, "a") as f:  # one line per timing
            f.write(f"{os.getpid()}\n")
        time.sleep(0.3)  # long enough that the other processes arrive while this one times
        return [64, os.getpid() % 8, 8, 3]

    out.put(tune_cache.shared_pick("gemm|m 64|n 4096|k 4096", tune))


def test_processes_started_together_time_a_shape_once_and_take_one_pick(tmp_path):
    cache, timed = tmp_path / "picks.json", tmp_path / "timed.log"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_pick_in_process, args=(str(cache), str(timed), out)) for _ in range(4)]
    for p in procs:
        p.start()
    picks = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(timed.read_text().splitlines()) == 1  # timed by one process
    assert all(p == picks[0] for p in picks)  # taken by all four
    assert json.loads(cache.read_text()) == {"gemm|m 64|n 4096|k 4096": picks[0]}


def test_off_times_in_every_call_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(tune_cache.ENV, "off")
    monkeypatch.chdir(tmp_path)
    calls = []
    assert tune_cache.cache_path() is None
    for _ in range(2):
        assert tune_cache.shared_pick("k", lambda: calls.append(1) or None) is None
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_a_stored_pick_is_read_and_a_torn_file_is_timed_afresh(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "sub" / "picks.json"
    monkeypatch.setenv(tune_cache.ENV, str(cache))
    assert tune_cache.shared_pick("a", lambda: [128, 2, 8, 4]) == [128, 2, 8, 4]
    assert tune_cache.shared_pick("a", lambda: pytest.fail("timed again")) == [128, 2, 8, 4]
    assert tune_cache.shared_pick("b", lambda: None) is None  # None: the library GEMM won
    assert json.loads(cache.read_text()) == {"a": [128, 2, 8, 4], "b": None}
    cache.write_text('{"a": [128, 2')  # a torn write from elsewhere
    assert tune_cache.shared_pick("a", lambda: [64, 1, 8, 3]) == [64, 1, 8, 3]
    assert "unreadable (JSONDecodeError); timing afresh" in capsys.readouterr().out
    assert json.loads(cache.read_text()) == {"a": [64, 1, 8, 3]}


def test_a_run_records_its_picks_once_per_growth(tmp_path, monkeypatch):
    monkeypatch.setenv(tune_cache.ENV, str(tmp_path / "picks.json"))
    log_dir = tmp_path / "logs"
    assert tune_cache.record_used_picks(log_dir) is None  # nothing picked yet: no file
    tune_cache.shared_pick("a", lambda: [64, 4, 8, 3])
    path = tune_cache.record_used_picks(log_dir)
    assert path == log_dir / "kernel_picks.jsonl"
    assert tune_cache.record_used_picks(log_dir) is None  # nothing new
    tune_cache.shared_pick("b", lambda: None)
    tune_cache.record_used_picks(log_dir)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["picks"] for line in lines] == [{"a": [64, 4, 8, 3]}, {"a": [64, 4, 8, 3], "b": None}]
    assert {"host", "pid"} <= set(lines[0])


def test_tuned_config_takes_the_shared_pick_in_a_new_process(tmp_path, monkeypatch):
    """triton_gemm.tuned_config times through the shared file: a second process (its in-process cache cleared)
    gets the first one's configuration as a tuple without timing."""
    from nemo_jetrl.precision.kernels import triton_gemm

    monkeypatch.setenv(tune_cache.ENV, str(tmp_path / "picks.json"))
    monkeypatch.setattr(triton_gemm.torch.cuda, "get_device_name", lambda index: "NVIDIA H200")
    timed = []
    monkeypatch.setattr(triton_gemm, "time_candidates", lambda *a: timed.append(a) or (64, 8, 8, 3))
    triton_gemm.tuned_config.cache_clear()
    args = (64, 4096, 12288, triton_gemm.torch.bfloat16, False, 0, None)
    assert triton_gemm.tuned_config(*args) == (64, 8, 8, 3)
    triton_gemm.tuned_config.cache_clear()  # as in a new process
    assert triton_gemm.tuned_config(*args) == (64, 8, 8, 3) and len(timed) == 1
    (key,) = json.loads(Path(tmp_path / "picks.json").read_text())
    assert "NVIDIA H200" in key and "m 64|n 4096|k 12288" in key and "vs none" in key
    triton_gemm.tuned_config.cache_clear()


def test_an_unusable_file_is_named_once_and_each_process_times_its_own(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")  # the cache's parent is a file: mkdir fails
    monkeypatch.setenv(tune_cache.ENV, str(blocker / "picks.json"))
    calls = []
    for _ in range(2):
        assert tune_cache.shared_pick("k", lambda: calls.append(1) or [64, 2, 8, 3]) == [64, 2, 8, 3]
    assert len(calls) == 2  # timed in each call, as with `off`
    out = capsys.readouterr().out
    assert out.count("not usable (FileExistsError") == 1 and "each process times its own" in out
    assert tune_cache.used_picks() == {"k": [64, 2, 8, 3]}
