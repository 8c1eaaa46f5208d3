"""Per-phase GRPO step times and peak GPU memory of CLI runs, from their log directories.

    python3 -m benchmarks.gpu_cli_report bf16=OUT/logs/bf16 fp8_kv=OUT/logs/fp8_kv --json OUT/summary.json

Each LOG_DIR is a run's `logger.log_dir`: `metrics.jsonl` gives the `timing/<phase>` seconds of every step (the
loop's own timers: generation, reward, logprobs, training, refit, kv_bootstrap, total_step_time) and
`config.yaml` the samples per step; `gpu_memory.csv` (optional, written by benchmarks/gpu_cli_run.sh with
`nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -i 0 -lms 500`: one GPU, every
process on it) the peak device memory in MiB.
The table shows the median over the steps after the first `--skip` (warm-up: Triton JIT, CUDA graph capture),
leaving out the steps that ran a phase under the profiler (`NEMO_JETRL_PROFILE`: `LOG_DIR/profile/step<N>_*.json`), and
the first step on its own, then the rollout's and the whole step's token rates (useful tokens/s: the step's real
tokens, `train/total_num_tokens`, per GRPO step second), the bytes each rank all-gathered per step (sharded runs:
`train/refit/allgather_bytes`) and the refit's gather time; where the run logged them, each phase's peak allocated
memory (`memory/<phase>_peak_gib`, the largest over the steps) against the start-up estimate
(`memory/estimate_<phase>_peak_gib`, algorithms/memory_preflight.py), and the mismatch per bin of response positions
(`train/mismatch_pos/<start>`, mean over the steps after `--skip`; `--position-plot PNG` draws it, which needs
matplotlib). `--baseline LABEL` adds each run's speed-up over that run per phase (the baseline's median over the
run's, both medians as in the table) and the whole step's speed-up step by step over the steps both timed;
`--phase-plot PNG` draws each run's median step as bars stacked by phase, the speed-up over the baseline on top.
Needs numpy (+ PyYAML for the rollout tokens/s row).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from nemo_jetrl.utils.metrics_jsonl import position_curve, read_metrics_jsonl
from nemo_jetrl.utils.phase_profile import profiled_steps

PHASES = ("generation", "generation/prefill", "generation/admission", "generation/cuda_graph_capture",
          "generation/decode", "generation/rank_gather", "logprobs", "training", "refit", "reward", "kv_bootstrap",
          "total_step_time")  # generation/...: device time inside the generation phase
STEP = "total_step_time"  # the whole step: its speed-ups to three decimals
MEMORY_FILE = "gpu_memory.csv"
ESTIMATED = {"generation": "rollout", "logprobs": "logprob", "training": "train"}  # phase -> the preflight's name


def read_timings(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """`{phase: [(step, seconds), ...]}` from `log_dir/metrics.jsonl` (unreadable lines skipped)."""
    path = log_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: did the run start? (logger.log_dir={log_dir})")
    series = read_metrics_jsonl(path)
    return {
        phase: list(zip(series[key][0].tolist(), series[key][1].tolist()))
        for phase in PHASES
        if (key := f"timing/{phase}") in series
    }


def read_gen_tokens(log_dir: Path) -> list[tuple[int, float]]:
    """`[(step, generated tokens of the step)]`: mean tokens per sample x samples per step (config.yaml)."""
    config, metrics = log_dir / "config.yaml", log_dir / "metrics.jsonl"
    samples = None
    if config.is_file():
        import yaml  # transformers' dependency: present wherever the run itself ran

        grpo = (yaml.safe_load(config.read_text()) or {}).get("grpo", {})
        if not grpo.get("use_dynamic_sampling"):
            samples = grpo.get("num_prompts_per_step", 0) * grpo.get("num_generations_per_prompt", 0)
    if not samples:
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        value = record.get("train/mean_gen_tokens_per_sample") if isinstance(record, dict) else None
        if isinstance(value, (int, float)) and isinstance(record.get("step"), int):
            out.append((record["step"], value * samples))
    return out


def read_metric(log_dir: Path, key: str) -> list[tuple[int, float]]:
    """`[(step, value)]` of one logged metric (e.g. `train/refit/allgather_bytes`), [] where never logged."""
    series = read_metrics_jsonl(log_dir / "metrics.jsonl")
    return list(zip(series[key][0].tolist(), series[key][1].tolist())) if key in series else []


def _steady_median(pairs: list[tuple[int, float]], timed: set[int]) -> float | None:
    steady = [v for s, v in pairs if s in timed]
    return statistics.median(steady) if steady else None


def peak_memory_mib(log_dir: Path) -> float | None:
    """Largest `memory.used` sample (MiB, the last field of each line) in `log_dir/gpu_memory.csv`."""
    path = log_dir / MEMORY_FILE
    if not path.is_file():
        return None
    values = []
    for line in path.read_text().splitlines():
        fields = [f.strip() for f in line.split(",")]
        try:
            values.append(float(fields[-1]))
        except (ValueError, IndexError):
            continue
    return max(values) if values else None


MISMATCH = {"token_mult_prob_error": "{:.7f}", "exact_token_fraction": "{:.4f}"}  # per-step rows of the table


def read_mismatch(log_dir: Path) -> dict[str, list[float]]:
    """`{name: [value of step 1, 2, ...]}` of the MISMATCH metrics (`train/<name>` in metrics.jsonl)."""
    series = read_metrics_jsonl(log_dir / "metrics.jsonl")
    return {name: series[f"train/{name}"][1].tolist() for name in MISMATCH if f"train/{name}" in series}


def summarize(log_dir: Path, skip: int = 1) -> dict:
    """Median seconds per phase over steps > `skip`, the first step's seconds, steps, peak memory, rollout tok/s."""
    timings = read_timings(log_dir)
    steps = sorted({s for series in timings.values() for s, _ in series})
    profiled = profiled_steps(log_dir)
    timed = {s for s in steps if s > skip and s not in profiled}
    summary: dict = {"log_dir": str(log_dir), "steps": len(steps), "median_s": {}, "first_step_s": {},
                     "profiled_steps": sorted(profiled & set(steps))}  # fmt: skip
    summary["timed_step_s"] = {str(s): v for s, v in timings.get("total_step_time", []) if s in timed}
    for phase, series in timings.items():
        steady = [v for s, v in series if s in timed]  # kv_bootstrap runs in the first step only: no median
        summary["median_s"][phase] = statistics.median(steady) if steady else None
        summary["first_step_s"][phase] = min(series)[1]
    gen = dict(timings.get("generation", []))
    rates = [tokens / gen[s] for s, tokens in read_gen_tokens(log_dir) if s in timed and gen.get(s)]
    summary["rollout_tokens_per_s"] = statistics.median(rates) if rates else None
    # useful tokens/s: the step's real tokens (prompts + responses, `train/total_num_tokens`) per GRPO step second
    total = dict(timings.get("total_step_time", []))
    useful = [(s, v / total[s]) for s, v in read_metric(log_dir, "train/total_num_tokens") if total.get(s)]
    summary["useful_tokens_per_s"] = _steady_median(useful, timed)
    # bytes each rank all-gathered in the step (sharded trainers: FSDP2's forwards + the FP8 refit) and the refit's
    # own seconds (the FP8 bits + scales and the rest into the rollout replica)
    summary["allgather_bytes"] = _steady_median(read_metric(log_dir, "train/refit/allgather_bytes"), timed)
    summary["refit_gather_s"] = _steady_median(read_metric(log_dir, "train/refit/seconds"), timed)
    summary["peak_gpu_memory_mib"] = peak_memory_mib(log_dir)
    summary["allocated_peak_gib"], summary["estimated_peak_gib"] = read_memory(log_dir)
    summary["reserved_peak_gib"] = read_memory(log_dir, "reserved_peak")[0]
    summary["graph_pool_gib"] = read_memory(log_dir, "graph_pool")[0]
    retries = read_metric(log_dir, "memory/total_step_time_alloc_retries")  # the caching allocator's, every step
    summary["alloc_retries"] = sum(v for _, v in retries) if retries else None
    curve = position_curve(read_metrics_jsonl(log_dir / "metrics.jsonl"), skip)
    summary["mismatch_by_position"] = {str(k): v for k, v in curve.items()}
    summary["per_step"] = read_mismatch(log_dir)
    return summary


def read_memory(log_dir: Path, kind: str = "peak") -> tuple[dict[str, float], dict[str, float]]:
    """({phase: its largest `memory/<phase>_<kind>_gib` over the steps after the first}, {phase: the preflight's
    estimate in GiB}); kind "peak" (allocated), "reserved_peak" or "graph_pool" (the free bytes of CUDA graphs'
    private pools at the phase's end: allocated + these is what the phase held of the device). A run of one step is
    compared on step 1 against the estimate without the optimizer state (`memory/estimate_optimizer_state_gib`:
    AdamW allocates it at step 1's optimizer step, after those peaks)."""
    series = read_metrics_jsonl(log_dir / "metrics.jsonl")
    measured, first_only = {}, False
    for phase in ESTIMATED:
        if (key := f"memory/{phase}_{kind}_gib") in series:
            steps, values = series[key]
            later = values[steps >= 2]
            first_only = first_only or not len(later)
            measured[phase] = float((later if len(later) else values).max())
    state = series.get("memory/estimate_optimizer_state_gib")
    less = float(state[1][0]) if first_only and state is not None else 0.0
    keys = {p: f"memory/estimate_{e}_peak_gib" for p, e in ESTIMATED.items()}
    estimated = {p: float(series[k][1][0]) - less for p, k in keys.items() if k in series}
    return measured, estimated


def speedup_rows(summaries: dict[str, dict], baseline: str) -> list[str]:
    """Rows of each run's speed-up over `baseline`: per phase (median over median) and the whole step per step
    (the steps both runs timed, in step order)."""
    base, labels = summaries[baseline], list(summaries)
    rows = []
    for phase in PHASES:
        ref = base["median_s"].get(phase)
        cells = [_ratio(ref, summaries[label]["median_s"].get(phase), phase) for label in labels]
        if ref and any(c != "—" for c, label in zip(cells, labels) if label != baseline):
            rows.append(f"| {phase}: x {baseline} | " + " | ".join(cells) + " |")
    cells = []
    for label in labels:
        run = summaries[label].get("timed_step_s", {})
        steps = sorted(set(run) & set(base.get("timed_step_s", {})), key=int)
        cells.append(" ".join(_ratio(base["timed_step_s"][k], run[k], STEP) for k in steps) or "—")
    rows.append(f"| total_step_time by step: x {baseline} | " + " | ".join(cells) + " |")
    return rows


def _ratio(reference: float | None, value: float | None, phase: str = "") -> str:
    """"1.25x"; the whole step's to three decimals (a 1.246x step against a 1.25x target must not read 1.25x)."""
    return "—" if not reference or not value else f"{reference / value:.{3 if phase == STEP else 2}f}x"


def format_table(summaries: dict[str, dict], baseline: str | None = None) -> str:
    """Markdown table: one row per phase (median s, first step s in brackets), one column per run; with a
    `baseline` label, the speed-up rows (`speedup_rows`) after the phases."""
    labels = list(summaries)
    phases = [p for p in PHASES if any(p in s["first_step_s"] for s in summaries.values())]
    rows = ["| phase | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for phase in phases:
        cells = []
        for label in labels:
            s = summaries[label]
            m, f = s["median_s"].get(phase), s["first_step_s"].get(phase)
            median = "—" if m is None else f"{m:.2f} s"
            cells.append("—" if f is None else f"{median} (1st {f:.2f})")
        rows.append(f"| {phase} | " + " | ".join(cells) + " |")
    if baseline is not None:
        rows += speedup_rows(summaries, baseline)
    extra = {
        "rollout tokens/s": lambda s: "—" if s["rollout_tokens_per_s"] is None else f"{s['rollout_tokens_per_s']:,.0f}",
        "useful tokens/s": lambda s: _fmt(s.get("useful_tokens_per_s"), "{:,.0f}"),
        "all-gather MB/step": lambda s: _fmt(s.get("allgather_bytes"), "{:,.1f}", 1e-6),
        "refit gather s": lambda s: _fmt(s.get("refit_gather_s"), "{:.3f}"),
        "peak GPU memory": lambda s: (
            "—" if s["peak_gpu_memory_mib"] is None else f"{s['peak_gpu_memory_mib'] / 1024:.1f} GiB"
        ),
        "allocator retries, all steps": lambda s: _fmt(s.get("alloc_retries"), "{:.0f}"),
        "steps logged": lambda s: str(s["steps"]),
        "timed steps (s)": lambda s: " ".join(f"{v:.2f}" for v in s.get("timed_step_s", {}).values()) or "—",
        "profiled steps (not in the medians)": lambda s: ", ".join(map(str, s.get("profiled_steps", []))) or "—",
        "first step / median step": lambda s: (
            "—" if not s["median_s"].get("total_step_time") else
            f"{s['first_step_s']['total_step_time'] / s['median_s']['total_step_time']:.2f}x"
        ),  # fmt: skip
        **{
            f"{name} by step": lambda s, name=name, fmt=fmt: " ".join(fmt.format(v) for v in s["per_step"].get(name, []))
            or "—"
            for name, fmt in MISMATCH.items()
        },
    }
    for name, cell in extra.items():
        rows.append(f"| {name} | " + " | ".join(cell(summaries[label]) for label in labels) + " |")
    for phase in ESTIMATED:  # allocated peak per phase against the start-up estimate
        cells = [_memory_cell(summaries[label], phase) for label in labels]
        if any(c != "—" for c in cells):
            rows.append(f"| {phase} peak allocated (estimate) | " + " | ".join(cells) + " |")
    for phase in ESTIMATED:  # captured runs: what the phase held (allocated + the graphs' pools) against the estimate
        cells = [_memory_cell(summaries[label], phase, held=True) for label in labels]
        if any(summaries[label].get("graph_pool_gib", {}).get(phase) for label in labels):
            rows.append(f"| {phase} peak allocated + graph pools (estimate) | " + " | ".join(cells) + " |")
    for phase in ESTIMATED:  # the caching allocator's footprint per phase (runs that logged it)
        cells = [_fmt(summaries[label].get("reserved_peak_gib", {}).get(phase), "{:.1f} GiB") for label in labels]
        if any(c != "—" for c in cells):
            rows.append(f"| {phase} peak reserved | " + " | ".join(cells) + " |")
    bins = sorted({int(b) for s in summaries.values() for b in s["mismatch_by_position"]})
    for b in bins:  # token_mult_prob_error per response-position bin
        cells = [f"{v:.4f}" if (v := summaries[label]["mismatch_by_position"].get(str(b))) is not None else "—"
                 for label in labels]  # fmt: skip
        rows.append(f"| mismatch at position {b}+ | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def phase_split(summary: dict) -> dict[str, float]:
    """A run's median step in parts that add up to its median `total_step_time` (seconds): the decode's device time,
    the rest of the generation phase, logprobs, training, and everything else of the step."""
    m = {k: v for k, v in summary["median_s"].items() if v is not None}
    gen, decode = m.get("generation", 0.0), min(m.get("generation/decode", 0.0), m.get("generation", 0.0))
    parts = {"decode (device)": decode, "rest of generation": gen - decode, "logprobs": m.get("logprobs", 0.0),
             "training": m.get("training", 0.0)}  # fmt: skip
    parts["other"] = max(m.get("total_step_time", 0.0) - sum(parts.values()), 0.0)
    return parts


def plot_phases(summaries: dict[str, dict], path: Path, baseline: str | None = None) -> Path:
    """Each run's median step as a bar stacked by `phase_split`, its seconds (and speed-up over `baseline`) on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.plot_performance import stacked_bars

    labels = list(summaries)
    parts = [phase_split(summaries[label]) for label in labels]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(labels), 4.2))
    stacked_bars(ax, labels, parts)
    ref = summaries[baseline]["median_s"].get("total_step_time") if baseline else None
    for i, label in enumerate(labels):
        total = summaries[label]["median_s"].get("total_step_time")
        if total:
            text = f"{total:.2f} s" + (f"\n{_ratio(ref, total, STEP)}" if ref and label != baseline else "")
            ax.text(i, sum(parts[i].values()), text, ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds per GRPO step (median)")
    ax.set_title("GRPO step by phase" + (f", speed-up over {baseline}" if baseline else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "—" if value is None else spec.format(value * scale)


def _memory_cell(summary: dict, phase: str, held: bool = False) -> str:
    """"measured GiB (estimate, estimate / measured - 1)"; held: measured is the allocated peak + the graph pools."""
    measured, estimated = summary["allocated_peak_gib"].get(phase), summary["estimated_peak_gib"].get(phase)
    if measured is None:
        return "—"
    if held:
        measured += summary.get("graph_pool_gib", {}).get(phase) or 0.0
    if estimated is None:
        return f"{measured:.1f} GiB"
    return f"{measured:.1f} GiB ({estimated:.1f}, {estimated / measured - 1:+.0%})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=LOG_DIR", help="a run's label and logger.log_dir")
    parser.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the medians (default 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the summaries as JSON here")
    parser.add_argument("--position-plot", type=Path, default=None, help="draw the mismatch per position bin here")
    parser.add_argument("--step-plot", type=Path, default=None, help="draw each phase's seconds per step here")
    parser.add_argument("--baseline", default=None, metavar="LABEL", help="add every run's speed-up over this run")
    parser.add_argument("--phase-plot", type=Path, default=None, help="draw each run's median step by phase here")
    args = parser.parse_args(argv)
    summaries = {}
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            print(f"error: expected LABEL=LOG_DIR, got {spec!r}", file=sys.stderr)
            return 2
        try:
            summaries[label] = summarize(Path(path), args.skip)
        except FileNotFoundError as exc:
            print(f"warning: {label}: {exc}", file=sys.stderr)
    if not summaries:
        print("error: no run had a metrics.jsonl", file=sys.stderr)
        return 1
    if args.baseline is not None and args.baseline not in summaries:
        print(f"error: --baseline {args.baseline}: no run has that label (labels: {', '.join(summaries)})",
              file=sys.stderr)  # fmt: skip
        return 2
    print(format_table(summaries, args.baseline))
    if args.position_plot is not None:
        from nemo_jetrl.utils.plots import plot_mismatch_position

        runs = {label: read_metrics_jsonl(Path(s["log_dir"]) / "metrics.jsonl") for label, s in summaries.items()}
        drawn = plot_mismatch_position(runs, args.position_plot, args.skip)
        none = f"none (no train/mismatch_pos/* after step {args.skip}; a one-step run needs --skip 0)"
        print(f"position plot: {drawn or none}")
    if args.step_plot is not None:  # the runs overlaid, one panel per phase: spikes and warm-up step by step
        from nemo_jetrl.utils.plots import plot_comparison

        runs = {label: Path(s["log_dir"]) / "metrics.jsonl" for label, s in summaries.items()}
        keys = [f"timing/{phase}" for phase in PHASES]
        print(f"step plot: {plot_comparison(runs, args.step_plot, keys, smoothing=0.0, title='Seconds per step')}")
    if args.phase_plot is not None:
        print(f"phase plot: {plot_phases(summaries, args.phase_plot, args.baseline)}")
    if args.json is not None:
        args.json.write_text(json.dumps(summaries, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
