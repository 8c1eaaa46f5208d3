"""The long-response accuracy study (examples/accuracy_study.py --study long): the arms' configs resolve to the
intended precision settings and differ in nothing else, the length presets hold the longest worked solution, every
arm fits its share of an H200 by the memory preflight, and the --quick stage runs every arm on the CPU (SFT 2 steps,
GRPO 1 step each through run_grpo.py), skips everything when run again, and packs its small outputs."""

from __future__ import annotations

import copy
import importlib.util
import json
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from jetrl_testkit.accuracy import outside_arm_keys
from transformers import Qwen3ForCausalLM

from nemo_jetrl.algorithms.memory_preflight import memory_preflight
from nemo_jetrl.config import load_config
from nemo_jetrl.environments import LongMultiplicationTask
from nemo_jetrl.models.tokenizer import build_char_tokenizer
from nemo_jetrl.policy.memory_estimate import ModelShape
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
_spec = importlib.util.spec_from_file_location("accuracy_study", REPO / "examples" / "accuracy_study.py")
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)
H200_GIB = 139.8

preset = PrecisionRecipe.preset
# arm -> (precision recipe, IS truncation type, generation.matched_kernels, generation.deterministic)
EXPECTED = {
    "bf16": (preset("bf16"), None, False, False),
    "fp8_rollout_only": (preset("fp8_rollout_only"), None, False, False),
    "fp8_rollout_only_tis": (preset("fp8_rollout_only"), "tis", False, False),
    "fp8_rollout_only_icepop": (preset("fp8_rollout_only"), "icepop", False, False),
    "fp8_kv_rollout_only": (preset("fp8_rollout_only", kv_cache_dtype="fp8"), None, False, False),  # no KV fake quant
    "fp8": (preset("jetrl"), None, False, False),
    "fp8_kv": (preset("jetrl_kv"), None, False, False),
    "fp8_kv_matched": (preset("jetrl_kv"), None, True, False),
    "fp8_kv_exact": (preset("jetrl_kv"), None, False, True),
}


def test_long_arm_configs_resolve_to_their_precision_and_nothing_else_differs():
    assert set(EXPECTED) == set(study.LONG_ARMS + study.LONG_OPTIONAL_ARMS)
    flat = {}
    for arm, (recipe, truncation, matched, exact) in EXPECTED.items():
        cfg = validate_config(load_config(CONFIGS / f"accuracy_long_{arm}.yaml"))
        assert PrecisionRecipe.from_config(cfg.policy) == recipe, arm
        assert cfg.loss_fn.truncated_importance_sampling_type == truncation
        assert cfg.loss_fn.use_importance_sampling_correction is (truncation is not None)
        assert (cfg.policy.generation.matched_kernels, cfg.policy.generation.deterministic) == (matched, exact)
        assert cfg.data.dataset_name == "long_multiplication" and cfg.grpo.mismatch_position_bin == 128
        assert cfg.policy.prev_logprobs_source == "train_forward"
        flat[arm] = outside_arm_keys(cfg.model_dump())
    assert all(flat[arm] == flat["bf16"] for arm in EXPECTED)


def test_length_presets_hold_the_longest_worked_solution():
    """1k / 2k / 4k: 7 / 10 / 13 digits, responses of at most 1,086 / 2,151 / 3,576 tokens (+ eos) within
    max_new_tokens, prompt + response within the total; the base YAML is the 2k preset."""
    expected = {"1k": (7, 1086, 1152, 1280, 8), "2k": (10, 2151, 2304, 2432, 4), "4k": (13, 3576, 3712, 3840, 2)}
    for length, (digits, longest, max_new, total, rows) in expected.items():
        assert study.LONG_LENGTHS[length] == digits
        task = LongMultiplicationTask(num_digits=digits, val_size=0)
        lengths = study.long_lengths(digits)
        assert task.max_response_chars == longest and longest + 1 <= lengths["max_new_tokens"] == max_new
        assert 1 + task.prompt_chars + max_new <= lengths["max_total"] == total
        assert lengths["micro_rows"] == rows and 64 % rows == 0  # 8 prompts x 8 samples split evenly
        assert lengths["sft_batch"] * (1 + task.prompt_chars + longest + 1) == pytest.approx(65536, rel=0.25)
    base = validate_config(load_config(CONFIGS / "accuracy_long_base.yaml", study.long_grpo_overrides(10)))
    assert base.model_dump() == validate_config(load_config(CONFIGS / "accuracy_long_base.yaml")).model_dump()


@pytest.mark.parametrize("length", ["1k", "2k", "4k"])
def test_every_arm_fits_a_sixteenth_of_an_h200(length):
    """One GPU running 2 seeds x 8 arms: each arm's step fits 1/16 of the memory by the preflight's estimate."""
    digits = study.LONG_LENGTHS[length]
    lengths = study.long_lengths(digits)
    config = study.accuracy_sft.model_config(study.accuracy_sft.SHAPES["long"], lengths["max_total"], 128)
    shape = ModelShape.from_config(config)
    assert 100e6 < shape.params() < 110e6 and shape.layers * shape.layer_linear_params() == 103_809_024
    for arm in EXPECTED:
        overrides = study.long_grpo_overrides(digits) + ["cluster.device=cuda"]
        cfg = validate_config(load_config(CONFIGS / f"accuracy_long_{arm}.yaml", overrides))
        result = memory_preflight(cfg, shape=shape, capacity=int(H200_GIB / 16 * 2**30))
        assert max(result.peaks.values()) <= 0.9 * H200_GIB / 16 * 2**30, (arm, result.line)


def test_every_long_linear_is_fp8_blockable():
    shape = study.accuracy_sft.SHAPES["long"]
    dims = (shape["hidden_size"], shape["intermediate_size"], shape["head_dim"] * shape["num_attention_heads"],
            shape["head_dim"] * shape["num_key_value_heads"])  # fmt: skip
    assert all(d % 128 == 0 for d in dims)
    assert study.accuracy_sft.linear_parameters(shape) == 103_809_024
    # 6 N per token + the attention products: 3.6K-token rows cost 1.3x the linears alone
    flops = study.accuracy_sft.train_flops_per_token(shape, 3632)
    assert flops == pytest.approx(6 * 103_809_024 + 6 * 12 * 3632 * 768)


@pytest.mark.slow
def test_quick_long_stage_runs_every_arm_resumes_and_packs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "study"
    argv = ["stage", "--study", "long", "--quick", "--inline", "--seeds", "0", "--out", str(out),
            "--pack", str(tmp_path / "quick.tar.gz"), "--time-limit-s", "3000"]  # fmt: skip
    assert study.main(argv) == 0
    stage = out / "quick"
    status = json.loads((stage / "stage.json").read_text())["jobs"]  # the SFT's and the base variant's jobs
    assert set(status) == {"sft/seed0", *(f"seed0/{a}" for a in study.LONG_ARMS)}
    assert all(status[f"seed0/{a}"]["reason"] == "finished" and status[f"seed0/{a}"]["steps"] == 1
               for a in study.LONG_ARMS)  # fmt: skip
    meta = json.loads((stage / "seed0" / "sft" / "sft_meta.json").read_text())
    assert meta["task"] == "long_multiplication" and meta["steps"] == 2 and meta["vocab_size"] == 128
    assert 0.0 <= meta["gate_forced_exact"] <= 1.0 and meta["gate_passed"] is True  # gate 0: arms run from it

    first = {}
    for arm in study.LONG_ARMS:
        rows = [json.loads(x) for x in (stage / "seed0" / "arms" / arm / "metrics.jsonl").read_text().splitlines()]
        first[arm] = next(r for r in rows if "train/reward_mean" in r)
        bins = sorted(k for k in first[arm] if k.startswith("train/mismatch_pos/"))
        assert bins[0] == "train/mismatch_pos/00000" and len(bins) >= 2, arm  # 16-token bins of the response
        assert "validation/sampled_accuracy" in {k for r in rows for k in r}
        val = next(r for r in rows if "validation/accuracy" in r)  # the base config's grpo.val_reference: the referee
        assert 0.0 <= val["validation/reference_accuracy"] <= 1.0, arm
        assert arm != "bf16" or val["validation/reference_accuracy"] == val["validation/accuracy"]
    tmpe = {a: first[a]["train/token_mult_prob_error"] for a in study.LONG_ARMS}
    assert tmpe["fp8_rollout_only"] > 1.001 > tmpe["fp8"] >= 1.0  # BF16 trainer scoring an FP8 rollout
    assert tmpe["fp8_kv_rollout_only"] > 1.001 and first["fp8_kv_rollout_only"]["train/refit/kv_k_scale_max"] > 0
    exact = {a: first[a]["train/exact_token_fraction"] for a in study.LONG_ARMS}
    if _cpu_linears_row_invariant(study.accuracy_sft.SHAPES["quick"]):
        assert exact["fp8_kv_matched"] == 1.0  # matched kernels: bitwise on-policy
    else:  # bitwise only where the device's GEMMs are row-invariant (docs/mismatch.md); near it here, as unified is
        assert exact["fp8_kv_matched"] >= 0.99 and abs(tmpe["fp8_kv_matched"] - 1) < 1e-5, (exact, tmpe)
    assert "train/is_oob_ratio" in first["fp8_rollout_only_icepop"]

    for arm in study.LONG_ARMS:  # under a deadline each arm checkpoints (its last step here: nothing to continue)
        arm_dir = stage / "seed0" / "arms" / arm
        assert (arm_dir / "checkpoints" / "step_1" / "meta.json").is_file() and not study.accuracy_stage.arm_continues(
            arm_dir
        )

    capsys.readouterr()
    assert study.main(argv) == 0  # again: every arm done, so no SFT and no arm runs
    printed = capsys.readouterr().out
    assert "8 arms already done" in printed and "sft step" not in printed and "GRPO done" not in printed

    with tarfile.open(tmp_path / "quick.tar.gz") as tar:
        names = tar.getnames()
    assert "quick/stage.json" in names and "quick/seed0/arms/fp8_kv/metrics.jsonl" in names
    assert "quick/seed0/sft/sft_meta.json" in names and not any(n.endswith((".safetensors", ".pt")) for n in names)

    # the referee: two FP8 arms' last checkpoints through one BF16 rollout, their own weights
    import nemo_jetrl.evals.eval as eval_module
    from nemo_jetrl.utils.checkpoint import CheckpointManager

    seen, original = [], eval_module.load_checkpoint_policy

    def recording(run, checkpoint_dir):
        step = original(run, checkpoint_dir)
        saved = CheckpointManager(Path(checkpoint_dir), keep_top_k=None).load_latest()["policy"]["model"]
        now = run.policy.model.state_dict()
        same = all(torch.equal(now[k].float(), v.float()) for k, v in saved.items())
        g = run.cfg.policy.generation
        seen.append((Path(checkpoint_dir).parent.name, run.cfg.policy.precision, g.precision, g.kv_cache_dtype,
                     g.matched_kernels, same))  # fmt: skip
        return step

    monkeypatch.setattr(eval_module, "load_checkpoint_policy", recording)
    evaluate = ["evaluate", "--study", "long", "--out", str(out), "--variant", "quick", "--inline", "--arms",
                "fp8_kv,fp8_kv_matched", "--reference-tests", "2", "--pack", str(tmp_path / "ref.tar.gz")]  # fmt: skip
    assert study.main(evaluate) == 0
    assert sorted(seen) == [("fp8_kv", "bf16", "bf16", "auto", False, True),
                            ("fp8_kv_matched", "bf16", "bf16", "auto", False, True)]  # fmt: skip
    reference = json.loads((stage / "reference_eval.json").read_text())
    assert set(reference) == {"seed0/fp8_kv", "seed0/fp8_kv_matched"}
    for entry in reference.values():
        res = entry["results"]
        assert entry["reason"] == "finished" and res["checkpoint_step"] == 1 and res["num_tests_per_prompt"] == 2
        assert res["num_prompts"] == 4 and 0.0 <= res["accuracy"] <= 1.0  # the arms' grpo.max_val_samples
    with tarfile.open(tmp_path / "ref.tar.gz") as tar:
        assert "quick/seed0/arms/fp8_kv/reference_eval/results.json" in tar.getnames()
    assert study.main(["evaluate", "--study", "long", "--out", str(out), "--variant", "absent"]) == 2
    def broken(run, checkpoint_dir):
        raise ValueError("a referee that fails")

    monkeypatch.setattr(eval_module, "load_checkpoint_policy", broken)
    assert study.main(evaluate[:-2]) == 1  # its earlier results.json is not read as this run's
    assert all(v["results"] is None for v in json.loads((stage / "reference_eval.json").read_text()).values())


def _cpu_linears_row_invariant(shape: dict) -> bool:
    """Does this CPU's float32 GEMM (the FP8 emulation's and the lm_head's) give a row the same bits at every row
    count the matched self-check tries, at the model's linear shapes? (It does not everywhere: small row counts
    take other BLAS kernels on some CPUs.)"""
    from nemo_jetrl.models.matched_check import REFERENCE_ROWS, Product, row_invariance_problem

    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    gen = torch.Generator().manual_seed(0)
    for k, n in {(hidden, hidden), (hidden, 2 * inter), (inter, hidden), (hidden, 128)}:  # attention, MLP, lm_head
        w = torch.randn(n, k, generator=gen)  # [N, K]
        gemm = lambda x, w=w: (x @ w.t(),)  # noqa: E731  (both sides: the float32 GEMM)
        x = torch.randn(REFERENCE_ROWS, k, generator=gen)  # [4096, K]
        if row_invariance_problem(Product(f"{k}x{n}", k, n, gemm, gemm), x) is not None:
            return False
    return True


def test_cli_errors_name_the_problem(tmp_path, capsys):
    assert study.main(["stage", "--out", str(tmp_path)]) == study.USER_ERROR
    assert "--study long" in capsys.readouterr().err
    assert study.main(["stage", "--study", "long", "--arms", "bf16,fp16", "--out", str(tmp_path)]) == study.USER_ERROR
    assert "fp16" in capsys.readouterr().err
    assert study.main(["grpo", "--study", "long", "--arm", "fp8", "--out", str(tmp_path)]) == study.USER_ERROR
    assert "no SFT checkpoint" in capsys.readouterr().err


def _sft_task_and_tokenizer():
    task = study.accuracy_sft.make_scratchpad_task("long_multiplication", num_digits=2, val_size=8, seed=1)
    return task, build_char_tokenizer(task.ALPHABET, task.VOCAB_SIZE, model_max_length=256)


def test_sft_micro_batches_accumulate_the_one_batch_gradient():
    """Two micro-batches of 4 rows weighted by their scored tokens give the 8-row batch's loss and gradient."""
    task, tok = _sft_task_and_tokenizer()
    problems = task.train_batch(0, 8)
    config = study.accuracy_sft.model_config(study.accuracy_sft.SHAPES["quick"], 128, task.VOCAB_SIZE)
    torch.manual_seed(0)
    models = [Qwen3ForCausalLM(config), None]
    models[1] = copy.deepcopy(models[0])
    losses = []
    for model, micro in zip(models, (8, 4)):
        optim = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is the (clipped) gradient itself
        losses.append(study.accuracy_sft._train_step(model, optim, task, problems, tok, torch.device("cpu"), micro))
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) and losses[0] > 3.0  # ~log(128) untrained
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, atol=2e-7, rtol=1e-5)


class _Oracle(torch.nn.Module):
    """Logits whose argmax is the next input token (teacher forcing), except at one (row, position)."""

    def __init__(self, vocab: int, wrong: tuple[int, int] | None = None):
        super().__init__()
        self.vocab, self.wrong = vocab, wrong

    def forward(self, input_ids):
        nxt = torch.roll(input_ids, -1, dims=1)  # [B, S]: the token each position predicts
        if self.wrong is not None:
            nxt = nxt.clone()
            nxt[self.wrong] = (nxt[self.wrong] + 1) % self.vocab
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


def test_teacher_forced_exact_counts_sequences_with_every_response_token_right():
    task, tok = _sft_task_and_tokenizer()
    problems = task.validation(8)
    prompt_len = 1 + task.prompt_chars  # <bos> + prompt
    cpu = torch.device("cpu")
    exact, token_acc = study.accuracy_sft.teacher_forced_exact(_Oracle(task.VOCAB_SIZE), task, problems, tok, cpu, 3)
    assert (exact, token_acc) == (1.0, 1.0)
    # the prediction of row 2's first response token is wrong: one sequence of 8, one token of all scored
    wrong = _Oracle(task.VOCAB_SIZE, wrong=(2, prompt_len - 1))
    exact, token_acc = study.accuracy_sft.teacher_forced_exact(wrong, task, problems[:3], tok, cpu, 3)
    tokens = sum(len(task.solution(p)) + 1 for p in problems[:3])
    assert exact == pytest.approx(2 / 3) and token_acc == pytest.approx(1 - 1 / tokens)
    # a wrong prediction inside the prompt is not scored
    exact, _ = study.accuracy_sft.teacher_forced_exact(
        _Oracle(task.VOCAB_SIZE, wrong=(0, 2)), task, problems[:3], tok, cpu, 3
    )
    assert exact == 1.0


def test_sweep_variants_name_their_directories_and_override_only_what_differs_from_the_base():
    cfg = validate_config(load_config(CONFIGS / "accuracy_long_base.yaml"))
    assert (cfg.policy.generation.temperature, cfg.policy.optimizer.lr) == (study.BASE_TEMPERATURE, study.BASE_LR)
    args = study.build_parser().parse_args(["stage", "--study", "long", "--length", "4k", "--temperature", "1.0,0.7",
                                            "--lr", "2e-5,5e-5"])  # fmt: skip
    assert study.variants(args) == [
        ("4k", []),
        ("4k_lr5e-05", ["policy.optimizer.lr=5e-05"]),
        ("4k_T0.7", ["policy.generation.temperature=0.7"]),
        ("4k_T0.7_lr5e-05", ["policy.generation.temperature=0.7", "policy.optimizer.lr=5e-05"]),
    ]
    assert study.variants(study.build_parser().parse_args(["stage", "--study", "long"])) == [("2k", [])]
    tagged = study.build_parser().parse_args(["stage", "--study", "long", "--tag", "temp", "--temperature", "0.7"])
    assert study.variants(tagged) == [("2k-temp_T0.7", ["policy.generation.temperature=0.7"])]
    assert study.stage_root_name(tagged) == "2k-temp"  # its SFT
    for bad in (["--temperature", "hot"], ["--tag", "a_b"], ["--seeds", "0,x"]):
        with pytest.raises(SystemExit):
            study.build_parser().parse_args(["stage", *bad])


def test_an_sft_stopped_by_a_cap_continues_where_it_stopped_as_one_run(tmp_path):
    """Three steps in one call and one in the next (the resume file between) == four steps in one call, bit for bit:
    weights, losses and the gate checks' curve."""
    from safetensors.torch import load_file

    settings = dict(study.QUICK_LONG_SFT, max_steps=4, gate=2.0, max_time_s=600.0)  # a gate no model passes

    def sft(out, **cap):
        return study.accuracy_sft.run_sft(out, seed=0, data_seed=1234, device=torch.device("cpu"), **settings, **cap)

    whole = sft(tmp_path / "whole")
    first = sft(tmp_path / "split", max_new_steps=3)
    resume = tmp_path / "split" / study.accuracy_stage.SFT_RESUME_FILE
    assert (first["steps"], first["calls"], first["gate_passed"]) == (3, 1, False) and resume.is_file()
    second = sft(tmp_path / "split")
    assert (second["steps"], second["calls"], whole["calls"]) == (4, 2, 1) and not resume.exists()
    assert second["final_loss"] == whole["final_loss"]
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    curve = [[{k: r[k] for k in ("step", "loss", "forced_exact")} for r in map(json.loads, open(d / "sft_curve.jsonl"))]
             for d in (tmp_path / "whole", tmp_path / "split")]  # fmt: skip
    assert curve[0] == curve[1] and [r["step"] for r in curve[0]] == [2, 4]


def test_the_sft_flags_set_the_long_sft_and_reach_each_seeds_process(tmp_path):
    parse = study.build_parser().parse_args
    default = study.sft_settings(parse(["sft", "--study", "long", "--length", "4k"]))
    assert (default["lr"], default["batch_size"], default["micro_batch_size"], default["gate_sampled"]) == (
        5e-4, 16, 8, 0.1
    )
    stage = parse(["stage", "--study", "long", "--length", "4k", "--sft-lr", "2e-4", "--sft-rows", "32",
                   "--sft-max-time-s", "540", "--sft-gate-sampled", "0.2", "--sft-steps", "600",
                   "--sft-deterministic", "--out", str(tmp_path)])  # fmt: skip
    want = default | {"lr": 2e-4, "batch_size": 32, "max_time_s": 540.0, "gate_sampled": 0.2, "fixed_steps": 600,
                      "deterministic": True}  # fmt: skip
    assert study.sft_settings(stage) == want
    sub = study.seed_args(stage, tmp_path / "4k", 1)
    argv = study.sft_argv(sub)  # what the seed's SFT process is started with
    assert study.sft_settings(parse(argv)) == want and parse(argv).out == tmp_path / "4k" / "seed1"
    assert "--sft-deterministic" in argv and "deterministic" not in default  # off unless asked: run_sft's default
    off = parse(["stage", "--study", "long", "--no-sft-deterministic", "--out", str(tmp_path)])
    assert study.sft_settings(parse(study.sft_argv(study.seed_args(off, tmp_path, 0))))["deterministic"] is False


def test_a_deterministic_sft_trains_under_deterministic_algorithms_and_restores_the_callers_setting(
    tmp_path, monkeypatch
):
    """`deterministic`: every training step runs with torch's deterministic algorithms on, the gate checks and the
    caller with them as they were; on the CPU (deterministic either way) the weights equal a plain run's bit for
    bit, so the flag changes the algorithms, not the arithmetic."""
    from safetensors.torch import load_file

    seen = []
    train_step = study.accuracy_sft._train_step

    def recording(*args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return train_step(*args, **kwargs)

    monkeypatch.setattr(study.accuracy_sft, "_train_step", recording)
    settings = dict(study.QUICK_LONG_SFT, max_steps=3, gate=2.0, max_time_s=600.0)
    runs = {}
    for flag in (True, False):
        seen.clear()
        meta = study.accuracy_sft.run_sft(tmp_path / str(flag), seed=0, data_seed=1234, device=torch.device("cpu"),
                                          deterministic=flag, **settings)  # fmt: skip
        assert seen == [flag] * 3 and meta["deterministic"] is flag
        assert not torch.are_deterministic_algorithms_enabled()
        runs[flag] = load_file(tmp_path / str(flag) / "model.safetensors")
    on, off = runs[True], runs[False]
    assert on.keys() == off.keys() and all(torch.equal(on[k], off[k]) for k in on)


def test_the_sft_gate_can_require_sampled_accuracy(tmp_path):
    """A greedy gate of 0 passes at the first check; an impossible sampled gate then fails it, after a sampled
    rollout whose accuracy the metadata records. The rule itself: greedy first, then sampled."""
    gate_passed = study.accuracy_sft.gate_passed
    assert not gate_passed({"greedy_accuracy": None}, 0.3, 0.0)
    assert not gate_passed({"greedy_accuracy": 0.2, "sampled_accuracy": 0.9}, 0.3, 0.1)
    assert gate_passed({"greedy_accuracy": 0.4}, 0.3, 0.0)
    assert not gate_passed({"greedy_accuracy": 0.4, "sampled_accuracy": 0.05}, 0.3, 0.1)
    assert not gate_passed({"greedy_accuracy": 0.4}, 0.3, 0.1)  # sampled not measured
    assert gate_passed({"greedy_accuracy": 0.4, "sampled_accuracy": 0.1}, 0.3, 0.1)

    def sft(out, gate_sampled):
        settings = dict(study.QUICK_LONG_SFT, max_steps=2, gate=0.0, gate_sampled=gate_sampled)
        return study.accuracy_sft.run_sft(out, seed=0, data_seed=1234, device=torch.device("cpu"), **settings)

    plain, strict = sft(tmp_path / "plain", 0.0), sft(tmp_path / "strict", 1.01)
    assert plain["gate_passed"] and plain["gate_sampled_accuracy"] is None
    assert not strict["gate_passed"] and 0.0 <= strict["gate_sampled_accuracy"] <= 1.0
    assert strict["gate_greedy_accuracy"] == plain["gate_greedy_accuracy"]  # the same run up to the gate


def test_a_fixed_step_sft_trains_past_a_passed_gate_and_checks_it_once(tmp_path):
    """With fixed_steps the gate stops nothing: a gate of 0 that a gated run passes at its first check (step 2)
    lets the fixed run train on to step 3, which it checks (greedy measured, no precheck skip) and records; an
    impossible gate fails at the same step; a fixed step past max_steps is refused."""
    def sft(out, **kw):
        settings = dict(study.QUICK_LONG_SFT, max_steps=4, gate=0.0) | kw
        return study.accuracy_sft.run_sft(out, seed=0, data_seed=1234, device=torch.device("cpu"), **settings)

    gated, fixed = sft(tmp_path / "gated"), sft(tmp_path / "fixed", fixed_steps=3)
    assert (gated["steps"], gated["fixed_steps"], gated["gate_passed"]) == (2, None, True)
    assert (fixed["steps"], fixed["fixed_steps"], fixed["gate_passed"]) == (3, 3, True)
    assert [json.loads(r)["step"] for r in open(tmp_path / "fixed" / "sft_curve.jsonl")] == [3]  # one check
    assert 0.0 <= fixed["gate_greedy_accuracy"] <= 1.0
    strict = sft(tmp_path / "strict", fixed_steps=3, gate=1.01)
    assert (strict["steps"], strict["gate_passed"]) == (3, False)
    assert strict["gate_greedy_accuracy"] == fixed["gate_greedy_accuracy"]  # the same model at step 3
    assert not (tmp_path / "strict" / study.accuracy_stage.SFT_RESUME_FILE).exists()  # done, not to be continued
    with pytest.raises(ValueError, match="fixed_steps=5"):
        sft(tmp_path / "past", fixed_steps=5)


def test_a_stage_refuses_sft_steps_past_max_steps_before_running_anything(tmp_path, capsys):
    argv = ["stage", "--study", "long", "--length", "2k", "--sft-steps", "6000", "--out", str(tmp_path / "s")]
    assert study.main(argv) == study.USER_ERROR
    assert capsys.readouterr().err == "error: --sft-steps 6000: must be 1 to the SFT's max_steps (5000)\n"
    assert not (tmp_path / "s").exists()  # nothing ran
    assert study.main(["sft", "--study", "long", "--quick", "--sft-steps", "0", "--out", str(tmp_path)]) == 2
