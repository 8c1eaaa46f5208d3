"""bench_rollout_syncs on the CPU (`--quick`): both presets roll out, are timed and profiled, and the table carries
their decode time per step and the host's waits per step (none: a CPU run makes no CUDA runtime calls)."""

import json

from benchmarks import bench_rollout_syncs


def test_quick_run_reports_every_preset(tmp_path, capsys):
    out = tmp_path / "syncs.json"
    assert bench_rollout_syncs.main(["--quick", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["preset"] for r in results] == ["jetrl_kv", "bf16"]
    for r in results:
        assert r["decode_ms_per_step"] > 0
        assert r["syncs_per_step"] == 0 and r["busy_ms"] == 0 and r["idle_ms"] == 0
    assert "syncs/step" in capsys.readouterr().out
