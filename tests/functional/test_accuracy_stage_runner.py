"""The long study's stage runner (examples/accuracy_stage.py) with stand-in processes: SFT per seed, arms spread
over the GPUs with their memory share, stopped at the deadline, skipped when done, repeated from one SFT. (Its
report: test_accuracy_stage_report.py.)"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import accuracy_stage as stage  # noqa: E402
import accuracy_study  # noqa: E402

FAKE = """
import json, os, sys, time
out, kind = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "env.json"), "w") as f:
    json.dump({"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "share": sys.argv[3]}, f)
if kind.startswith("sft"):  # "sft_fail": a finished SFT whose held-out gate failed
    for name in ("config.json", "model.safetensors"):
        open(os.path.join(out, name), "w").write("{}")
    with open(os.path.join(out, "sft_meta.json"), "w") as f:
        json.dump({"gate_passed": kind == "sft"}, f)
    sys.exit(0)
if kind == "bad":
    sys.exit(3)
if kind == "saver":  # stops itself before the deadline, its newest checkpoint at step 3 of 10
    log = os.path.join(out, "metrics.jsonl")
    start = sum(1 for _ in open(log)) if os.path.exists(log) else 0
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        for step in range(start + 1, start + 4):
            f.write(json.dumps({"step": step, "train/reward_mean": 0.5}) + "\\n")
    os.makedirs(os.path.join(out, "checkpoints", f"step_{start + 3}"), exist_ok=True)
    open(os.path.join(out, "checkpoints", f"step_{start + 3}", "meta.json"), "w").write("{}")
    open(os.path.join(out, "config.yaml"), "w").write("grpo:\\n  max_num_steps: 6\\n")
    sys.exit(0)
steps = 2 if kind == "fast" else 10**6
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for step in range(1, steps + 1):
        f.write(json.dumps({"step": step, "train/reward_mean": 0.5}) + "\\n")
        f.flush()
        time.sleep(0.05)
"""


def _stage_jobs(tmp_path: Path, stage_dir: Path, gate_fails: tuple[int, ...] = ()):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    made = []

    def sft_job(seed, gpu):
        made.append(("sft", seed, gpu))
        out, kind = stage.sft_dir(stage_dir, seed), "sft_fail" if seed in gate_fails else "sft"
        return stage.Job(f"sft/seed{seed}", script, [str(out), kind, "-"], stage_dir / f"sft{seed}.log", gpu)

    def arm_job(variant, seed, arm, gpu, per_gpu, repeat):
        made.append((arm, seed, gpu) + ((repeat,) if repeat else ()))
        out = stage.arm_dir(variant, seed, arm, repeat)
        name = f"{stage.run_label(seed, repeat)}/{arm}"
        return stage.Job(name, script, [str(out), arm, str(per_gpu)], out.parent / f"{arm}.log", gpu)

    return sft_job, arm_job, made


def test_stage_spreads_arms_over_gpus_stops_at_the_deadline_and_resumes(tmp_path):
    """Variant 2k: three arms; variant 2k_T0.7: one arm from the same SFT; two seeds over two GPUs."""
    stage_dir, variant = tmp_path / "2k", tmp_path / "2k_T0.7"
    sft_job, arm_job, made = _stage_jobs(tmp_path, stage_dir)
    arms_of = {stage_dir: ["fast", "slow", "bad"], variant: ["fast"]}
    status = stage.run_stage(stage_dir, arms_of, [0, 1], ["0", "1"], time.monotonic() + 4.0, sft_job, arm_job,
                             poll_s=0.1)  # fmt: skip
    jobs = status[stage_dir]["jobs"]
    assert [(j["reason"], j["rc"]) for j in (jobs["sft/seed0"], jobs["sft/seed1"])] == [("finished", 0)] * 2
    assert {(s, g) for k, s, g in made if k == "sft"} == {(0, "0"), (1, "1")}  # seed i on GPU i
    for seed in (0, 1):
        assert jobs[f"seed{seed}/fast"] | {"wall_s": 0} == {"rc": 0, "reason": "finished", "steps": 2, "wall_s": 0}
        assert jobs[f"seed{seed}/slow"]["reason"] == "time_limit" and jobs[f"seed{seed}/slow"]["steps"] >= 2
        assert jobs[f"seed{seed}/bad"]["reason"] == "failed" and jobs[f"seed{seed}/bad"]["rc"] == 3
        assert status[variant]["jobs"][f"seed{seed}/fast"]["steps"] == 2
    assert not (variant / "seed0" / "sft").exists()  # the variant starts from the length's SFT
    runs = [(stage_dir, s, a) for a in arms_of[stage_dir] for s in (0, 1)] + [
        (variant, 0, "fast"),
        (variant, 1, "fast"),
    ]
    envs = {(d.name, s, a): json.loads((stage.arm_dir(d, s, a) / "env.json").read_text()) for d, s, a in runs}
    assert sorted(e["gpu"] for e in envs.values()) == ["0"] * 4 + ["1"] * 4  # round-robin: 4 processes per GPU
    assert {e["share"] for e in envs.values()} == {"4"}  # each arm is told 4 processes share its GPU
    assert json.loads((stage_dir / "stage.json").read_text())["jobs"] == jobs

    made.clear()  # again: only the failed arms run; their SFT checkpoints are there
    status = stage.run_stage(stage_dir, arms_of, [0, 1], ["0", "1"], time.monotonic() + 4.0, sft_job, arm_job,
                             poll_s=0.1)  # fmt: skip
    assert sorted(made) == [("bad", 0, "0"), ("bad", 1, "1")]
    assert status[stage_dir]["jobs"]["seed0/slow"]["reason"] == "time_limit"


def test_an_arm_that_saved_before_its_last_step_continues_in_the_next_call(tmp_path):
    """`saver` saves at step 3 of 6 and stops: the next call runs it again in the same directory (its metrics go on
    from step 3), and once its checkpoint reaches step 6 it is done; a finished arm without a checkpoint is not rerun."""
    stage_dir = tmp_path / "2k"
    sft_job, arm_job, made = _stage_jobs(tmp_path, stage_dir)
    arms_of = {stage_dir: ["saver", "fast"]}
    for call in range(3):
        made.clear()
        status = stage.run_stage(stage_dir, arms_of, [0], ["0"], time.monotonic() + 4.0, sft_job, arm_job, poll_s=0.1)
        ran = sorted(a for a, _, _ in made)
        assert ran == [["fast", "saver", "sft"], ["saver"], []][call], (call, ran)
    saver = stage.arm_dir(stage_dir, 0, "saver")
    assert stage.metrics_steps(saver / "metrics.jsonl") == 6 and status[stage_dir]["jobs"]["seed0/saver"]["steps"] == 6
    assert not stage.arm_continues(saver)


def test_arm_checkpoint_overrides_resolve_in_the_arms_config(tmp_path):
    """The overrides an arm gets under a finite deadline: checkpointing into its directory, newest only, and NeMo-RL's
    deadline key at the budget; none without a deadline."""
    from nemo_jetrl.config import load_config
    from nemo_jetrl.schema import validate_config

    assert stage.arm_checkpoint_overrides(tmp_path, float("inf")) == []
    overrides = stage.arm_checkpoint_overrides(tmp_path / "arm", 3725.9)
    cfg = validate_config(load_config(REPO / "examples" / "configs" / "accuracy_long_fp8.yaml", overrides))
    ckpt = cfg.checkpointing
    assert (ckpt.enabled, ckpt.keep_top_k, ckpt.checkpoint_must_save_by) == (True, 1, "00:01:02:05")
    assert Path(ckpt.checkpoint_dir) == tmp_path / "arm" / stage.ARM_CHECKPOINTS


def test_a_seed_whose_sft_fails_its_gate_runs_no_arm_and_continues_or_redoes_its_sft(tmp_path):
    stage_dir = tmp_path / "1k"
    sft_job, arm_job, made = _stage_jobs(tmp_path, stage_dir, gate_fails=(1, 2))
    status = stage.run_stage(stage_dir, {stage_dir: ["fast"]}, [0, 1, 2], ["0"], time.monotonic() + 4.0, sft_job,
                             arm_job, poll_s=0.1)  # fmt: skip
    jobs = status[stage_dir]["jobs"]
    assert jobs["seed0/fast"]["reason"] == "finished"
    for seed in (1, 2):
        assert jobs[f"seed{seed}/fast"] == {"rc": None, "reason": "sft_gate_failed", "steps": 0}
        assert ("fast", seed, "0") not in made and not stage.arm_dir(stage_dir, seed, "fast").exists()
        (stage.sft_dir(stage_dir, seed) / "earlier.txt").write_text("the first call's SFT")
    (stage.sft_dir(stage_dir, 1) / stage.SFT_RESUME_FILE).write_text("state")  # seed 1 stopped at its time cap
    made.clear()  # the next call: seeds 1 and 2's SFT again (now passing), then their arms; seed 0 is done
    sft_job, arm_job, made = _stage_jobs(tmp_path, stage_dir)
    status = stage.run_stage(stage_dir, {stage_dir: ["fast"]}, [0, 1, 2], ["0"], time.monotonic() + 4.0, sft_job,
                             arm_job, poll_s=0.1)  # fmt: skip
    assert sorted(made) == [("fast", 1, "0"), ("fast", 2, "0"), ("sft", 1, "0"), ("sft", 2, "0")]
    assert status[stage_dir]["jobs"]["seed1/fast"]["reason"] == "finished"
    assert (stage.sft_dir(stage_dir, 1) / "earlier.txt").is_file()  # kept: its SFT continues from the resume file
    assert not (stage.sft_dir(stage_dir, 2) / "earlier.txt").exists()  # no resume file: redone from scratch


def test_a_fixed_step_sft_that_failed_its_gate_is_not_redone_with_the_same_steps(tmp_path):
    stage_dir = tmp_path / "2k"
    sft_job, arm_job, made = _stage_jobs(tmp_path, stage_dir, gate_fails=(1,))

    def call(fixed):
        return stage.run_stage(stage_dir, {stage_dir: ["fast"]}, [0, 1], ["0"], time.monotonic() + 4.0, sft_job,
                               arm_job, poll_s=0.1, sft_fixed_steps=fixed)  # fmt: skip

    call(5)
    meta = stage.sft_dir(stage_dir, 1) / "sft_meta.json"
    meta.write_text(json.dumps({"gate_passed": False, "fixed_steps": 5, "steps": 5}))  # ran its 5 steps, failed
    made.clear()
    status = call(5)  # the same steps again: the verdict stands, nothing runs
    assert made == [] and status[stage_dir]["jobs"]["seed1/fast"]["reason"] == "sft_gate_failed"
    assert stage.sft_settled(stage_dir, 1, 5) and not stage.sft_settled(stage_dir, 1, 6)
    assert not stage.sft_settled(stage_dir, 1, None)
    status = call(6)  # more steps asked for: redone (the stand-in fails it again)
    assert made == [("sft", 1, "0")]


def test_run_jobs_honours_parallel_and_marks_jobs_not_started(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    jobs = [
        stage.Job(f"j{i}", script, [str(tmp_path / f"j{i}"), "fast", "-"], tmp_path / f"j{i}.log") for i in range(3)
    ]
    stage.run_jobs(jobs, time.monotonic() + 60, parallel=1, poll_s=0.05)
    assert [j.result["reason"] for j in jobs] == ["finished"] * 3
    walls = [j.result["wall_s"] for j in jobs]
    assert walls == sorted(walls)  # one after another
    late = [stage.Job("late", script, [str(tmp_path / "late"), "fast", "-"], tmp_path / "late.log")]
    stage.run_jobs(late, time.monotonic() - 1)
    assert late[0].result["reason"] == "not_started" and not (tmp_path / "late").exists()


def test_repeats_run_each_arm_again_from_the_same_sft_each_with_its_own_grpo_seed(tmp_path):
    """--repeats 3 with one seed: one SFT, three runs of each arm (seed0, seed0r1, seed0r2), each with its own
    GRPO seed (the same one with --same-grpo-seed)."""
    stage_dir = tmp_path / "2k"
    sft_job, arm_job, made = _stage_jobs(tmp_path, stage_dir)
    status = stage.run_stage(stage_dir, {stage_dir: ["fast"]}, [0], ["0", "1"], time.monotonic() + 4.0, sft_job,
                             arm_job, poll_s=0.1, repeats=3)  # fmt: skip
    assert sorted(made) == [("fast", 0, "0"), ("fast", 0, "0", 2), ("fast", 0, "1", 1), ("sft", 0, "0")]
    jobs = status[stage_dir]["jobs"]
    assert [jobs[k]["steps"] for k in ("seed0/fast", "seed0r1/fast", "seed0r2/fast")] == [2, 2, 2]
    assert stage.sft_label("seed0r2") == "seed0" and stage.sft_label("seed12") == "seed12"
    made.clear()  # again: all done
    stage.run_stage(stage_dir, {stage_dir: ["fast"]}, [0], ["0"], time.monotonic() + 4.0, sft_job, arm_job,
                    poll_s=0.1, repeats=3)  # fmt: skip
    assert made == []
    parse = accuracy_study.build_parser().parse_args
    args = parse(["stage", "--study", "long", "--repeats", "3", "--out", str(tmp_path)])
    seeds = [next(a for a in accuracy_study.grpo_argv(accuracy_study.seed_args(args, stage_dir, 1, r), "bf16")
                  if a.startswith("grpo.seed=")) for r in range(3)]  # fmt: skip
    assert seeds == ["grpo.seed=43", "grpo.seed=1043", "grpo.seed=2043"]
    args = parse(["stage", "--study", "long", "--repeats", "3", "--same-grpo-seed", "--out", str(tmp_path)])
    argvs = [accuracy_study.grpo_argv(accuracy_study.seed_args(args, stage_dir, 1, r), "bf16") for r in range(3)]
    same = {a for argv in argvs for a in argv if a.startswith("grpo.seed=")}
    assert same == {"grpo.seed=43"}
    with pytest.raises(SystemExit):
        parse(["stage", "--repeats", "0"])


def test_an_arm_is_not_tied_to_one_gpu_and_the_gpus_hold_the_same_mix(tmp_path):
    """4 arms x 2 seeds on 2 GPUs: plain round-robin put each arm on the same GPU in both seeds (bf16 and fp8 on
    GPU 0, the other two on GPU 1: their step times measured the GPU's mix). Shifted by one GPU per seed, every arm
    runs on both GPUs and both GPUs hold one run of every arm; 3 arms stay as round-robin had them."""
    d = tmp_path / "2k"
    arms = ["bf16", "fp8_rollout_only", "fp8", "fp8_kv"]
    ready = [(d, s, a, 0) for s in (0, 1) for a in arms]
    placed = stage.arm_gpus(ready, {d: arms}, ["0", "1"])
    assert placed == ["0", "1", "0", "1", "1", "0", "1", "0"]
    for gpu in ("0", "1"):
        assert sorted(a for (_, _, a, _), g in zip(ready, placed) if g == gpu) == sorted(arms)
    three = [(d, s, a, r) for s in (0,) for r in (0, 1) for a in arms[:3]]
    assert stage.arm_gpus(three, {d: arms[:3]}, ["0", "1"]) == ["0", "1", "0", "1", "0", "1"]
    assert stage.arm_gpus(ready, {d: arms}, []) == [None] * 8  # the CPU: no CUDA_VISIBLE_DEVICES
