"""SFT stage of the accuracy studies (docs/accuracy.md, docs/accuracy_long.md): a Qwen3 trained from scratch on
worked scratchpad solutions.

A fresh `Qwen3ForCausalLM` (`SHAPES`) with a character-level tokenizer learns the worked solutions of a builtin
scratchpad task (`task_name`: `long_addition`, ~220 tokens, or `long_multiplication`, 1K-4K tokens; loss on the
response: scratchpad, answer and eos), FP32 master weights, BF16 autocast on CUDA, `micro_batch_size` rows per
backward (gradient accumulation). Every `eval_every` steps the held-out greedy accuracy (the GRPO loop's own
rollout engine, `NativeGenerationEngine`) is checked against `gate`: training stops at the first check that passes
it, so GRPO starts from a model that is partly right. With `precheck` a check first runs one teacher-forced forward
over the gate problems; the fraction whose every response token is the argmax (the worked solution greedy decoding
would reproduce) is a near lower bound of greedy accuracy, and the greedy rollout runs only once it reaches half the
gate (long responses make each rollout costly). Checks happen at fixed steps, so the stopping step depends on the
seeds only (and on `max_time_s`, a wall-time cap). With `fixed_steps` the gate does not stop training: it trains
exactly that many steps (on `max_steps`' schedule, so the model is the one a gated run has at that step) and checks
the gate once, at the end; starts of one length are then alike across seeds and calls, and the gate only decides
whether GRPO may start from them. Writes an HF directory (weights, tokenizer, sft_meta.json, sft_curve.jsonl,
sft_corpus_sample.jsonl) that `policy.model_name` can name. Used by examples/accuracy_study.py.

An SFT stopped by its time cap before the gate leaves `sft_resume.pt` (weights, AdamW state, step, wall time) in its
directory; the next `run_sft` there with the same settings continues from it (same batches, same schedule: the
steps of both calls are those of one uninterrupted run), so a task whose gate takes longer than one device call
spreads its SFT over several calls on one machine. A passed gate deletes the file.

With `init_from` (a finished SFT's directory that passed its gate, of the same task and shape) the model starts
from that SFT's weights instead of a fresh initialization: a curriculum, e.g. a 4k SFT from a 2k one (the rotary
positions carry over; the longer limit only widens the tokenizer's and config's). Its metadata records the source.

With `deterministic` the training steps run under `torch.use_deterministic_algorithms(True)` (and cuBLAS's fixed
workspace, `CUBLAS_WORKSPACE_CONFIG`, set before the first CUDA call), so that one seed's SFT can give the same start
again in another call or session; an operation without a deterministic implementation then raises instead of
running. The gate checks (inference only) run as without it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from accuracy_stage import SFT_RESUME_FILE as RESUME_FILE  # examples/ is on sys.path with this module
from transformers import Qwen3Config, Qwen3ForCausalLM

from nemo_jetrl.environments.factory import BUILTIN_TASKS
from nemo_jetrl.environments.scratchpad_task import ScratchpadTask
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer

# study: the 50M GPU model of docs/accuracy.md (~220-token addition); long: the 104M model of docs/accuracy_long.md
# (multiplication); quick: a CPU smoke model. Every linear dim is a multiple of 128 (FP8 blocks).
SHAPES: dict[str, dict[str, int]] = {
    "study": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=128),
    "long": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=128),
    "quick": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=128),
}  # fmt: skip
SCRATCHPAD_TASKS = ("long_addition", "long_multiplication")
CORPUS_SAMPLE_ROWS = 256


def make_scratchpad_task(task_name: str, **kwargs) -> ScratchpadTask:
    """The builtin scratchpad task `task_name` (a `data.dataset_name`) with `kwargs` (num_digits, val_size, seed)."""
    if task_name not in SCRATCHPAD_TASKS:
        raise ValueError(f"task {task_name!r}: the SFT stage knows {list(SCRATCHPAD_TASKS)}")
    return BUILTIN_TASKS[task_name](**kwargs)


def linear_parameters(shape: dict[str, int]) -> int:
    """Parameters of the decoder's linears (q, k, v, o, gate, up, down) for `shape`: the FP8-blockable ones."""
    h, heads = shape["hidden_size"], shape["head_dim"] * shape["num_attention_heads"]
    kv = shape["head_dim"] * shape["num_key_value_heads"]
    per_layer = 2 * h * heads + 2 * h * kv + 3 * h * shape["intermediate_size"]
    return shape["num_hidden_layers"] * per_layer


def train_flops_per_token(shape: dict[str, int], seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of a causal sequence of `seq_len` tokens: 6 x linear
    parameters + the attention products (QK^T and PV, 2 x 2 FLOPs per multiply-add over the seq_len / 2 keys a
    token sees on average, x 3 for forward + backward) per layer. Embeddings, norms and lm_head (vocabulary 64-128)
    are left out."""
    q_dim = shape["head_dim"] * shape["num_attention_heads"]
    return 6.0 * linear_parameters(shape) + 6.0 * shape["num_hidden_layers"] * seq_len * q_dim


def model_config(shape: dict[str, int], max_positions: int, vocab_size: int) -> Qwen3Config:
    """Qwen3 config of `shape` over a character vocabulary of `vocab_size` ids (tied embeddings)."""
    return Qwen3Config(
        architectures=["Qwen3ForCausalLM"],
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        rope_theta=10_000.0,
        dtype="float32",
        attn_implementation="sdpa",
        **shape,
    )


def sft_batch(task: ScratchpadTask, problems, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `<bos>prompt solution<eos>` rows [B, S] and labels [B, S] (-100 off the solution + eos).
    Padding sits after each row's last token, so causal attention needs no mask."""
    rows, labels = [], []
    for prob in problems:
        prompt_ids = tokenizer(prob.prompt).input_ids  # adds <bos>
        target = tokenizer(task.solution(prob), add_special_tokens=False).input_ids + [EOS_ID]
        rows.append(prompt_ids + target)
        labels.append([-100] * len(prompt_ids) + target)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)  # [B, S]
    label_ids = torch.full((len(rows), width), -100, dtype=torch.long)  # [B, S]
    for i, (row, lab) in enumerate(zip(rows, labels)):
        input_ids[i, : len(row)] = torch.tensor(row)
        label_ids[i, : len(lab)] = torch.tensor(lab)
    return input_ids, label_ids


def held_out_accuracy(
    engine: NativeGenerationEngine, tokenizer, task: ScratchpadTask, problems, greedy: bool = True
) -> float:
    """Greedy (or, `greedy=False`, sampled at the engine's temperature 1) exact-answer accuracy on `problems`,
    decoded as the GRPO loop decodes."""
    out = engine.generate([tokenizer(p.prompt).input_ids for p in problems], greedy=greedy)
    texts = [
        tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
        for ids, mask in zip(out.input_ids, out.response_mask)
    ]
    return float((task.score(texts, [p.answer for p in problems]) > 0.5).float().mean())


@torch.no_grad()
def teacher_forced_exact(model, task: ScratchpadTask, problems, tokenizer, device, rows: int) -> tuple[float, float]:
    """(fraction of `problems` whose every response token is the argmax given the worked solution before it, the
    token accuracy): one teacher-forced forward, `rows` problems at a time."""
    exact, right, total = 0, 0, 0
    for start in range(0, len(problems), rows):
        input_ids, labels = (t.to(device) for t in sft_batch(task, problems[start : start + rows], tokenizer))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=input_ids).logits  # [B, S, V]
        target, scored = labels[:, 1:], labels[:, 1:] != -100  # [B, S-1]: the next token, where a label is set
        hit = (logits[:, :-1].argmax(-1) == target) | ~scored
        exact += int(hit.all(dim=1).sum())
        right += int((hit & scored).sum())
        total += int(scored.sum())
    return exact / max(1, len(problems)), right / max(1, total)


def lr_at(step: int, lr: float, warmup: int, total: int) -> float:
    """Linear warm-up to `lr`, then cosine decay to lr / 10 at `total` steps."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def write_corpus_sample(path: Path, task: ScratchpadTask, rows: int) -> None:
    """The first `rows` SFT examples (training batch 0) as jsonl: prompt, solution, answer."""
    with path.open("w") as f:
        for prob in task.train_batch(0, rows):
            f.write(json.dumps({"prompt": prob.prompt, "solution": task.solution(prob), "answer": prob.answer}) + "\n")


def _train_step(model, optim, task, problems, tokenizer, device, micro_batch_size: int) -> float:
    """One optimizer step over `problems`, `micro_batch_size` rows per backward; returns the mean response loss."""
    batches = [sft_batch(task, problems[i : i + micro_batch_size], tokenizer)
               for i in range(0, len(problems), micro_batch_size)]  # fmt: skip
    scored = [int((labels[:, 1:] != -100).sum()) for _, labels in batches]  # the tokens HF's loss averages over
    optim.zero_grad(set_to_none=True)
    total = 0.0
    for (input_ids, labels), n in zip(batches, scored):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=input_ids.to(device), labels=labels.to(device)).loss
        weight = n / sum(scored)
        (loss * weight if len(batches) > 1 else loss).backward()
        total += float(loss.detach()) * weight
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    return total


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool):
    """torch's deterministic algorithms inside the block when `enabled`, the caller's setting restored after."""
    if not enabled:
        yield
        return
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _gate_check(
    model, engine, task, tokenizer, problems, device, gate: float, precheck: bool, rows: int, gate_sampled: float = 0.0
) -> dict:
    """The held-out figures of one gate check (module docstring): greedy accuracy (None when the precheck skipped
    the rollout), with `precheck` the teacher-forced exact fraction and token accuracy, and with `gate_sampled` > 0
    the sampled (temperature 1) accuracy once the greedy one reaches `gate`."""
    model.eval()
    row: dict[str, Any] = {}
    if precheck:
        row["forced_exact"], row["forced_token_accuracy"] = teacher_forced_exact(
            model, task, problems, tokenizer, device, rows
        )
    run_greedy = not precheck or row["forced_exact"] >= gate / 2
    row["greedy_accuracy"] = held_out_accuracy(engine, tokenizer, task, problems) if run_greedy else None
    if gate_sampled > 0 and row["greedy_accuracy"] is not None and row["greedy_accuracy"] >= gate:
        row["sampled_accuracy"] = held_out_accuracy(engine, tokenizer, task, problems, greedy=False)
    model.train()
    return row


def gate_passed(check: dict, gate: float, gate_sampled: float) -> bool:
    """The gate: greedy held-out accuracy >= `gate` and, with `gate_sampled` > 0, sampled accuracy >= it (a start
    whose samples are almost never right gives GRPO no reward to learn from: docs/accuracy_long.md, the 1k lr sweep)."""
    greedy, sampled = check["greedy_accuracy"], check.get("sampled_accuracy")
    if greedy is None or greedy < gate:
        return False
    return gate_sampled <= 0 or (sampled is not None and sampled >= gate_sampled)


def init_path(template: str | Path | None, seed: int) -> Path | None:
    """An `--sft-init-from` value for one seed: `{seed}` in it becomes the seed."""
    return None if template is None else Path(str(template).format(seed=seed))


def init_source(init_from: Path, task_name: str, shape: str) -> dict[str, Any]:
    """The metadata of the SFT `init_from` names, checked: it exists, passed its gate and trained `task_name` on
    `shape`; raises FileNotFoundError / ValueError naming what is wrong."""
    meta_path = Path(init_from) / "sft_meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"--sft-init-from {init_from}: no sft_meta.json there (not a finished SFT)")
    meta = json.loads(meta_path.read_text())
    if not meta.get("gate_passed"):
        raise ValueError(f"--sft-init-from {init_from}: that SFT did not pass its gate ({meta.get('steps')} steps)")
    if (meta.get("task"), meta.get("shape")) != (task_name, shape):
        raise ValueError(f"--sft-init-from {init_from}: it trained {meta.get('task')} on the {meta.get('shape')!r} "
                         f"shape, this SFT {task_name} on {shape!r}")  # fmt: skip
    return meta


def load_init(model, init_from: Path, task_name: str, shape: str) -> dict[str, Any]:
    """`init_from`'s weights into `model` (init_source checks it first); returns what sft_meta.json records of it."""
    meta = init_source(init_from, task_name, shape)
    source = Qwen3ForCausalLM.from_pretrained(init_from, dtype=torch.float32, local_files_only=True)
    model.load_state_dict(source.state_dict())
    return {"path": str(init_from), **{k: meta.get(k) for k in ("num_digits", "steps", "gate_greedy_accuracy")}}


def _load_resume(path: Path, settings: dict, model, optim, device: torch.device) -> dict[str, Any]:
    """An unfinished SFT's state from `path` into `model` and `optim` when its settings equal `settings`; else (no
    file, other settings) a fresh start's: step 0, no wall time, no call before."""
    fresh = {"step": 0, "wall_s": 0.0, "calls": 0, "check": {"greedy_accuracy": 0.0}, "loss": math.nan}
    if not path.is_file():
        return fresh
    state = torch.load(path, map_location=device, weights_only=False)
    if state["settings"] != settings:
        print(f"sft: {path} was written with other settings; starting afresh", flush=True)
        return fresh
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    print(f"sft: continuing from step {state['step']} ({state['wall_s']:.0f} s in {state['calls']} calls)", flush=True)
    return state


def run_sft(
    out: Path,
    *,
    shape: str,
    num_digits: int,
    data_seed: int,
    seed: int,
    device: torch.device,
    batch_size: int,
    lr: float,
    max_steps: int,
    warmup: int,
    eval_every: int,
    gate: float,
    gate_size: int,
    max_time_s: float,
    task_name: str = "long_addition",
    micro_batch_size: int | None = None,
    precheck: bool = False,
    max_positions: int | None = None,
    max_new_steps: int | None = None,
    gate_sampled: float = 0.0,
    fixed_steps: int | None = None,
    deterministic: bool = False,
    init_from: Path | None = None,
) -> dict[str, Any]:
    """Train, gate, save under `out`; returns the metadata written to sft_meta.json. `max_positions`: the model's
    position limit (default: the longest prompt + worked solution + eos). `max_new_steps`: at most this many steps
    in this call (a cap like `max_time_s`, beside it). `gate_sampled`: the gate's least sampled accuracy (0: none;
    `gate_passed`). `fixed_steps`: train exactly this many steps, the gate checked at the last only (module
    docstring). `deterministic`: the training steps under torch's deterministic algorithms; `init_from`: start from
    that SFT's weights (module docstring). Continues from `out`'s resume file when its settings match."""
    if fixed_steps is not None and not 0 < fixed_steps <= max_steps:
        raise ValueError(f"fixed_steps={fixed_steps}: must be in 1..max_steps ({max_steps})")
    last = fixed_steps or max_steps  # the step training ends at, whatever the gate says with fixed_steps
    if deterministic and device.type == "cuda":  # read when cuBLAS first allocates its workspace
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    task = make_scratchpad_task(task_name, num_digits=num_digits, val_size=max(gate_size, 512), seed=data_seed)
    max_len = 1 + task.prompt_chars + task.max_response_chars + 1  # bos, prompt, solution, eos
    max_positions = max(max_len, max_positions or 0)
    tokenizer = build_char_tokenizer(task.ALPHABET, task.VOCAB_SIZE, model_max_length=max_positions)
    torch.manual_seed(seed)
    config = model_config(SHAPES[shape], max_positions=max_positions, vocab_size=task.VOCAB_SIZE)
    model = Qwen3ForCausalLM(config)
    source = None if init_from is None else load_init(model, Path(init_from), task_name, shape)
    model = model.to(device).train()
    num_params = sum(p.numel() for p in model.parameters())
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=device.type == "cuda")
    engine = NativeGenerationEngine(
        model, max_new_tokens=task.max_response_chars + 1, stop_token_ids=[EOS_ID], pad_token_id=PAD_ID,
        compute_dtype=torch.bfloat16, device=device, cuda_graphs=device.type == "cuda",
    )  # fmt: skip
    micro = micro_batch_size or batch_size
    gate_problems = task.validation(gate_size)
    out.mkdir(parents=True, exist_ok=True)
    settings = dict(task=task_name, shape=shape, num_digits=num_digits, data_seed=data_seed, seed=seed,
                    batch_size=batch_size, micro=micro, lr=lr, max_steps=max_steps, warmup=warmup,
                    max_positions=max_positions, deterministic=deterministic)  # fmt: skip
    if source is not None:  # (absent otherwise: resume files written before the option still match)
        settings["init_from"] = source["path"]
    state = _load_resume(out / RESUME_FILE, settings, model, optim, device)
    step, earlier_s, calls = state["step"], state["wall_s"], state["calls"] + 1
    check, loss_value = state["check"], state["loss"]
    curve = (out / "sft_curve.jsonl").open("a" if step else "w")
    start = time.perf_counter()
    passed, first_step = False, step
    while (step < last and not (passed and fixed_steps is None) and time.perf_counter() - start < max_time_s
           and (max_new_steps is None or step - first_step < max_new_steps)):  # fmt: skip
        for group in optim.param_groups:
            group["lr"] = lr_at(step, lr, warmup, max_steps)
        with deterministic_algorithms(deterministic):
            loss_value = _train_step(model, optim, task, task.train_batch(step, batch_size), tokenizer, device, micro)
        step += 1
        if (step % eval_every == 0 and fixed_steps is None) or step == last:
            check = _gate_check(model, engine, task, tokenizer, gate_problems, device, gate,
                                precheck and fixed_steps is None, micro, gate_sampled)  # fmt: skip
            passed = gate_passed(check, gate, gate_sampled)
            wall = earlier_s + time.perf_counter() - start
            row = {"step": step, "loss": round(loss_value, 5), **check, "wall_s": round(wall, 1)}
            curve.write(json.dumps(row) + "\n")
            curve.flush()
            print(f"sft step {step}: loss {loss_value:.4f} held-out {check}", flush=True)
    curve.close()
    wall_s = earlier_s + time.perf_counter() - start
    resume = out / RESUME_FILE
    if passed or step >= last:
        resume.unlink(missing_ok=True)
    else:  # stopped by a cap: the next call continues here
        torch.save({"settings": settings, "step": step, "wall_s": wall_s, "calls": calls, "check": check,
                    "loss": loss_value, "model": model.state_dict(), "optim": optim.state_dict()}, resume)  # fmt: skip
    model.eval().to(torch.float32).save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_corpus_sample(out / "sft_corpus_sample.jsonl", task, CORPUS_SAMPLE_ROWS)
    seq_len = max_len - 1  # tokens per training row (the last label has no next token)
    meta = {
        "task": task_name, "shape": shape, **SHAPES[shape], "vocab_size": task.VOCAB_SIZE,
        "num_parameters": num_params, "linear_parameters": linear_parameters(SHAPES[shape]),
        "num_digits": num_digits, "max_positions": max_positions, "data_seed": data_seed, "seed": seed,
        "batch_size": batch_size, "micro_batch_size": micro, "lr": lr, "steps": step, "fixed_steps": fixed_steps,
        "deterministic": deterministic, "init_from": source,
        "gate": gate, "gate_passed": passed, "gate_size": gate_size, "gate_greedy_accuracy": check["greedy_accuracy"],
        "gate_forced_exact": check.get("forced_exact"), "gate_sampled": gate_sampled,
        "gate_sampled_accuracy": check.get("sampled_accuracy"), "final_loss": loss_value,
        "train_tokens": step * batch_size * seq_len,
        "train_flops_estimate": step * batch_size * seq_len * train_flops_per_token(SHAPES[shape], seq_len),
        "wall_time_s": round(wall_s, 1), "calls": calls,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
    }  # fmt: skip
    (out / "sft_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta
