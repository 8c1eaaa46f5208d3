"""The project's benchmarks, one module each, run from the repo root as `python -m benchmarks.<name>` (e.g.
`python -m benchmarks.bench_rollout --quick`). They use nemo_jetrl's public API only (tests/unit/benchmarks/
test_public_api.py holds it); docs/performance.md lists which module produced which figure."""
