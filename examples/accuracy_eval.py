"""One referee for every arm of the long-response accuracy study (docs/accuracy_long.md): each arm's last checkpoint
evaluated through the same BF16 rollout.

An arm's own validation runs through its own rollout engine, so an FP8 arm's held-out accuracy carries its rollout's
numerics (E4M3 weights, E4M3 K/V) as well as what its training did to the weights. `run_reference` takes each arm's
newest checkpoint (`<arm>/checkpoints/step_N`, the one a stage's deadline save leaves) and evaluates its weights
through examples/run_eval.py with the arm's own logged config.yaml and REFERENCE_OVERRIDES: a BF16 trainer, a BF16
rollout with a BF16 KV cache, no matched or exact kernels. The arms then differ only in their weights. Per arm:
greedy accuracy on the same held-out problems as its validation (`grpo.max_val_samples`) and pass@1 from `tests`
samples per problem at the arm's temperature, in `<arm>/reference_eval/results.json` (small: it is packed with
the stage). One process per arm, spread over the GPUs, as the stage's arms are.
"""

from __future__ import annotations

import json
from pathlib import Path

from accuracy_stage import ARM_CHECKPOINTS, Job, checkpoint_steps, gpu_of, run_jobs
from omegaconf import OmegaConf

REFERENCE_DIR = "reference_eval"
REFERENCE_OVERRIDES = (
    "policy.precision=bf16", "policy.generation.precision=bf16", "policy.generation.kv_cache_dtype=auto",
    "policy.fp8_cfg.train_kv_fake_quant=false", "policy.generation.matched_kernels=false",
    "policy.generation.deterministic=false", "checkpointing.enabled=false",
)  # fmt: skip
STATUS_FILE = "reference_eval.json"


def arms_with_checkpoints(variant: Path, arms: list[str] | None = None) -> list[Path]:
    """The arm directories (`seed*/arms/<arm>`, only `arms` when given) of a stage variant that hold a checkpoint
    and their config.yaml."""
    return sorted(
        arm for arm in variant.glob("seed*/arms/*")
        if (arms is None or arm.name in arms) and (arm / "config.yaml").is_file() and checkpoint_steps(arm)
    )  # fmt: skip


def reference_argv(arm: Path, tests: int) -> list[str]:
    """run_eval.py's command line for `arm`'s newest checkpoint through the BF16 referee (module docstring)."""
    samples = OmegaConf.select(OmegaConf.load(arm / "config.yaml"), "grpo.max_val_samples")
    out = arm / REFERENCE_DIR
    return [
        "--config", str(arm / "config.yaml"), *REFERENCE_OVERRIDES, f"logger.log_dir={out}",
        f"+eval.checkpoint_dir={arm / ARM_CHECKPOINTS}", f"+eval.save_path={out}", f"+eval.max_samples={samples}",
        f"+eval.num_tests_per_prompt={tests}", "+eval.k_value=1",
    ]  # fmt: skip


def run_reference(
    variant: Path, arms: list[Path], gpus: list[str], deadline: float, tests: int = 4, inline: bool = False,
    poll_s: float = 1.0,
) -> dict[str, dict]:  # fmt: skip
    """Evaluate the arm directories `arms` of `variant` (module docstring); returns and writes
    `variant/reference_eval.json`: each arm's job result and its results.json (None where it failed)."""
    import run_eval  # the eval entry point, in-process for `inline`

    script = Path(run_eval.__file__)
    jobs = []
    for i, arm in enumerate(arms):
        (arm / REFERENCE_DIR / "results.json").unlink(missing_ok=True)  # a failed run must not leave an older result
        argv = reference_argv(arm, tests)
        name = f"{arm.parent.parent.name}/{arm.name}"
        jobs.append(Job(f"reference/{name}", script, argv, arm / f"{REFERENCE_DIR}.log", gpu_of(i, gpus),
                        inline=lambda argv=argv: run_eval.main(argv)))  # fmt: skip
    run_jobs(jobs, deadline, inline, poll_s=poll_s)
    status = {job.name.split("/", 1)[1]: {**job.result, "results": read_reference(arm)} for job, arm in zip(jobs, arms)}
    (variant / STATUS_FILE).write_text(json.dumps(status, indent=2, sort_keys=True) + "\n")
    return status


def read_reference(arm: Path) -> dict | None:
    """An arm's referee results (run_eval's results.json: accuracy, pass@1, checkpoint_step), or None."""
    path = arm / REFERENCE_DIR / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def reference_rows(stage: Path, series: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict | None]]:
    """Each run's and arm's referee results in a stage directory (`stage/<run>/arms/<arm>`; `series`: their
    metrics by run and arm), None where absent, with `own_accuracy`: the arm's own greedy validation at the
    checkpoint's step (the last one at or before it, at `own_step`)."""
    rows: dict[str, dict[str, dict | None]] = {}
    for run, by_arm in series.items():
        rows[run] = {}
        for arm, metrics in by_arm.items():
            res = read_reference(stage / run / "arms" / arm)
            if res is not None:
                steps, values = metrics.get("validation/accuracy", ([], []))  # [validations] each
                own = [(int(s), float(v)) for s, v in zip(steps, values) if s <= res["checkpoint_step"]]
                res = {**res, "own_step": own[-1][0] if own else None, "own_accuracy": own[-1][1] if own else None}
            rows[run][arm] = res
    return rows


def referee_figures(res: dict | None) -> dict[str, float]:
    """A run's referee result (`reference_rows`' entry) as the report's tested figures; {} where it has none."""
    if res is None:
        return {}
    return {"referee_greedy": float(res["accuracy"]), "referee_pass@1": float(res["pass@1"])}


def reference_table(st: dict) -> list[str]:
    """Markdown (accuracy_long_report's stage summary `st`, its `reference`): per arm and run, the checkpoint's
    step, the arm's own greedy validation at that step (its own step in brackets where the last validation came
    before the checkpoint), the referee's greedy accuracy and pass@1; [] when no arm was evaluated."""
    from accuracy_report import ARM_LABELS, fmt

    ref = st.get("reference") or {}
    runs = [run for run in st["seeds"] if any(ref.get(run, {}).values())]
    if not runs:
        return []
    heads = [f"{run}: step / own rollout greedy / BF16 referee greedy / referee pass@1" for run in runs]
    lines = ["| arm | " + " | ".join(heads) + " |", "|---|" + "---|" * len(runs)]
    for arm in st["arms"]:
        cells = []
        for run in runs:
            res = ref[run].get(arm)
            if res is None:
                cells.append("-")
                continue
            own_step = res.get("own_step")
            at = f" (step {own_step})" if own_step is not None and own_step != res["checkpoint_step"] else ""
            cells.append(f"{res['checkpoint_step']} / {fmt(res['own_accuracy'])}{at} / {fmt(res['accuracy'])} / "
                         f"{fmt(res['pass@1'])}")  # fmt: skip
        lines.append(f"| {ARM_LABELS[arm]} | " + " | ".join(cells) + " |")
    return [*lines, ""]
