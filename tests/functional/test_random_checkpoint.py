"""examples/build_random_checkpoint.py: the tiny-test build has the requested shape, the analytic parameter count, a
working offline tokenizer and a correct word-problem set; the Qwen3 presets count as published; the GPU CLI-run
script works end to end on CPU (slow)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoTokenizer, Qwen3ForCausalLM

from nemo_jetrl.models.loading import check_fp8_blockable, load_model_and_tokenizer
from nemo_jetrl.models.random_checkpoint import (
    SHAPES,
    analytic_param_count,
    config_shape,
    qwen3_config,
    resolve_shape,
)

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "build_random_checkpoint", REPO / "examples" / "build_random_checkpoint.py"
)
cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli)


def _build(out: Path, *extra: str) -> int:
    return cli.main(["--out", str(out), "--shape", "tiny-test", "--layers", "3", "--seed", "7", *extra])


def test_tiny_build_has_the_requested_shape_count_tokenizer_and_data(tmp_path, capsys):
    assert _build(tmp_path / "a", "--train-rows", "40", "--val-rows", "8") == 0
    printed = capsys.readouterr().out
    model_dir, data_dir = tmp_path / "a" / "model", tmp_path / "a" / "data"
    shape = resolve_shape("tiny-test", 3)
    assert shape["num_hidden_layers"] == 3 and shape["hidden_size"] == 256

    config = json.loads((model_dir / "config.json").read_text())
    assert config_shape(config) == shape
    assert config["model_type"] == "qwen3" and config["dtype"] == "bfloat16"

    # parameter count: what is on disk (a tied lm_head is stored once) = the analytic count = what was printed
    tensors = load_file(model_dir / "model.safetensors")
    assert "lm_head.weight" not in tensors
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    count = sum(t.numel() for t in tensors.values())
    h, i, hd, layers = 256, 512, 128, 3
    by_hand = 512 * h + layers * (h * 2 * hd + 2 * h * hd + 2 * hd * h + 2 * hd + 3 * h * i + 2 * h) + h
    assert count == analytic_param_count(shape) == by_hand
    assert f"{count:,} parameters" in printed and str(model_dir.resolve()) in printed
    info = json.loads((tmp_path / "a" / "build_info.json").read_text())
    assert info["num_parameters"] == count and info["seed"] == 7

    # tokenizer: offline, round-trips a problem, special ids inside the model's vocab, ChatML template
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    problem = json.loads((data_dir / "train.jsonl").read_text().splitlines()[0])["problem"]
    assert tokenizer.decode(tokenizer(problem)["input_ids"]) == problem
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert config["eos_token_id"] == tokenizer.eos_token_id < config["vocab_size"]
    assert config["pad_token_id"] == tokenizer.pad_token_id < config["vocab_size"]
    assert len(tokenizer) <= config["vocab_size"]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    # the project's loader accepts the directory, and every linear can be FP8-blocked
    check_fp8_blockable(model_dir, config, 128)
    model, loaded_tok = load_model_and_tokenizer(str(model_dir))
    assert sum(p.numel() for p in model.parameters()) == count and loaded_tok.padding_side == "left"

    # data: requested row counts, unique, disjoint splits, each answer = the value of its problem
    splits = {
        name: [json.loads(line) for line in (data_dir / f"{name}.jsonl").read_text().splitlines()]
        for name in ("train", "val")
    }
    assert (len(splits["train"]), len(splits["val"])) == (40, 8)
    problems = [row["problem"] for rows in splits.values() for row in rows]
    assert len(set(problems)) == len(problems)
    for row in splits["train"] + splits["val"]:
        assert re.findall(r"\d+", row["problem"]) == re.findall(r"\d+", row["expression"]), row
        value = eval(row["expression"], {"__builtins__": {}})  # ints and + - * // only
        assert row["answer"] == str(value) and value > 0, row

    # same seed, same bits; a non-empty model dir is refused
    assert _build(tmp_path / "b", "--train-rows", "40", "--val-rows", "8") == 0
    assert (model_dir / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model" / "model.safetensors"
    ).read_bytes()
    assert (data_dir / "val.jsonl").read_text() == (tmp_path / "b" / "data" / "val.jsonl").read_text()
    assert _build(tmp_path / "a") == cli.USER_ERROR
    assert "exists and is not empty" in capsys.readouterr().err


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert cli.main(["--out", str(tmp_path), "--shape", "tiny-test", "--layers", "0"]) == cli.USER_ERROR
    assert "--layers must be an int >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:  # argparse: unknown choice
        cli.main(["--out", str(tmp_path), "--shape", "qwen3-0.6b"])
    assert raised.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize(
    "name, total, non_embedding, digits", [("qwen3-1.7b", 1.7, 1.4, 1), ("qwen3-8b", 8.2, 6.95, 2)]
)
def test_published_shapes_count_as_the_model_cards(name, total, non_embedding, digits):
    """Analytic count = transformers' Qwen3 on the meta device; billions as the model cards give them."""
    shape = resolve_shape(name)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3_config(shape, "bfloat16"))
    count = sum(p.numel() for p in model.parameters())
    assert count == analytic_param_count(shape)
    embeddings = shape["vocab_size"] * shape["hidden_size"] * (1 if shape["tie_word_embeddings"] else 2)
    assert round(count / 1e9, 1) == total
    assert round((count - embeddings) / 1e9, digits) == non_embedding
    assert SHAPES[name]["vocab_size"] == 151936 and SHAPES[name]["rope_theta"] == 1e6


@pytest.mark.slow
def test_gpu_cli_run_script_on_cpu(tmp_path):
    """benchmarks/gpu_cli_run.sh (build, the BF16 and FP8+KV runs side by side, report) through the shipped overlays,
    on CPU; each run gets half the machine's cores."""
    extra = (
        "grpo.num_prompts_per_step=2 grpo.num_generations_per_prompt=2 "
        "policy.generation.max_new_tokens=8 policy.max_total_sequence_length=256 data.max_input_seq_length=240"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHON": sys.executable,
        "SHAPE": "tiny-test",
        "DEVICE": "cpu",
        "STEPS": "2",
        "EXTRA": extra,
        "COPY_TO": str(tmp_path / "copied"),
    }
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_cli_run.sh", str(tmp_path), "check", "build", "side_by_side", "report"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    for variant in ("bf16", "fp8_kv"):
        assert summary[variant]["steps"] == 2
        assert summary[variant]["median_s"]["generation"] > 0 and summary[variant]["median_s"]["training"] > 0
    assert summary["fp8_kv"]["first_step_s"]["kv_bootstrap"] > 0 and "kv_bootstrap" not in summary["bf16"]["median_s"]
    assert "bf16 on GPU 0, fp8_kv on GPU 1, at the same time" in proc.stdout
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # nproc, as the script reads it (CI: 2 cores, 1 each)
    assert f"cluster.num_cpu_threads={threads} each)" in proc.stdout
    for variant in ("bf16", "fp8_kv"):
        config = yaml.safe_load((tmp_path / "copied" / variant / "config.yaml").read_text())
        assert config["cluster"]["num_cpu_threads"] == threads
    assert "memory_preflight" not in proc.stdout  # the runs' consoles (their config trees) go to their logs only
    assert all("memory_preflight" in (tmp_path / f"{v}.log").read_text() for v in ("bf16", "fp8_kv"))
    assert "| generation |" in proc.stdout and "| peak GPU memory |" in proc.stdout
    assert "| total_step_time by step: x bf16 |" in proc.stdout  # the report's speed-up rows over the BF16 run
    assert (tmp_path / "phases.png").stat().st_size > 10_000  # the median step by phase, per run
    for variant in ("bf16", "fp8_kv"):  # coin-flip rewards (env.coin_flip_rewards): the trainer's gradients are real
        rows = [json.loads(line) for line in (tmp_path / "copied" / variant / "metrics.jsonl").read_text().splitlines()]
        norms = [r["train/grad_norm"] for r in rows if "train/grad_norm" in r]
        assert len(norms) == 2 and max(norms) > 0, norms
    copied = sorted(str(p.relative_to(tmp_path / "copied")) for p in (tmp_path / "copied").rglob("*") if p.is_file())
    assert copied == [
        "bf16.log",
        "bf16/config.yaml",
        "bf16/metrics.jsonl",
        "fp8_kv.log",
        "fp8_kv/config.yaml",
        "fp8_kv/metrics.jsonl",
    ]
    report = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_cli_report", f"fp8_kv={tmp_path / 'copied' / 'fp8_kv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0 and "| training |" in report.stdout, report.stderr


@pytest.mark.parametrize(
    ("env_extra", "line"),
    [
        ({"PAIR_GPUS": "0 0"}, "error: side_by_side runs one GPU per variant: PAIR_GPUS names two different GPUs (got "
         "'0 0') and NPROC is 1 (got 1)"),
        ({"PAIR_VARIANTS": "fp8_kv fp8_kv"}, "error: side_by_side: PAIR_VARIANTS names two different variants of bf16 "
         "fp8 fp8_kv fp8_kv_matched fp8_kv_fast (got 'fp8_kv fp8_kv')"),
        ({"PAIR_VARIANTS": "bf16 fp9"}, "error: side_by_side: PAIR_VARIANTS names two different variants of bf16 fp8 "
         "fp8_kv fp8_kv_matched fp8_kv_fast (got 'bf16 fp9')"),
    ],
    ids=["one-gpu", "one-variant", "unknown-variant"],
)  # fmt: skip
def test_side_by_side_refuses_one_gpu_or_one_variant_for_both_runs(tmp_path, env_extra, line):
    """`side_by_side` runs two variants, each on its own GPU: the same GPU twice, the same variant twice or an unknown
    one is refused at once, exit 2, one line."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHON": sys.executable, **env_extra}
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_cli_run.sh", str(tmp_path), "side_by_side"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "logs" / "bf16").exists() and not (tmp_path / "bf16.log").exists()
