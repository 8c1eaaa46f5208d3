"""Supervised warm start of the builtin `tiny-arith` model on the arithmetic task (FP32, CPU-sized).

Trains a fresh tiny Qwen3 on `<bos>a+b=` -> `str(a+b)<eos>` (loss on the answer tokens and eos only) and stops as
soon as the held-out *sampled* accuracy (temperature 1) passes `--gate`: GRPO then has signal and room to improve.
The gate is checked every `--eval-every-s` seconds of training, so the stopping step depends on machine speed; the
training trajectory itself (data, init) and each check's samples depend only on the seeds.
Writes model (safetensors; fp32 when <= 14 MiB, else bf16), tokenizer, README.md and sft_meta.json to `--out`.

    uv run examples/run_sft.py --seed 0
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nemo_jetrl.environments import ArithmeticTask, Problem
from nemo_jetrl.models.tiny import TINY_ARITH_DIR, build_tiny_model
from nemo_jetrl.models.tokenizer import build_arith_tokenizer

FP32_MAX_BYTES = 14 * 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="model init + sampling seed")
    p.add_argument("--data-seed", type=int, default=1234, help="task seed; must equal GRPO's data.seed")
    p.add_argument("--num-digits", type=int, default=2)
    p.add_argument("--val-size", type=int, default=512)
    p.add_argument("--out", type=Path, default=TINY_ARITH_DIR)
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--gate", type=float, default=0.15, help="stop when held-out sampled accuracy >= gate")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--eval-every-s", type=float, default=3.0, help="seconds of training between gate checks")
    return p.parse_args(argv)


def sft_batch(problems: list[Problem], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
    """Right-padded `<bos>prompt answer<eos>` rows; labels are -100 everywhere but on answer + eos tokens."""
    rows, labels = [], []
    for prob in problems:
        prompt_ids = tokenizer(prob.prompt).input_ids  # adds <bos>
        answer_ids = tokenizer(prob.answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, S]
    label_ids = torch.full((len(rows), width), -100, dtype=torch.long)  # [B, S]
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, S]
    for i, (row, lab) in enumerate(zip(rows, labels)):
        input_ids[i, : len(row)] = torch.tensor(row)
        label_ids[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": label_ids}


@torch.no_grad()
def held_out_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: ArithmeticTask,
    problems: list[Problem],
    *,
    sample: bool,
) -> float:
    """Exact-match accuracy of greedy (`sample=False`) or temperature-1 sampled answers."""
    was_training = model.training
    model.eval()
    enc = tokenizer([p.prompt for p in problems], return_tensors="pt", padding=True)  # left-padded [B, P]
    out = model.generate(
        **enc,
        do_sample=sample,
        temperature=1.0 if sample else None,
        top_k=None,
        top_p=None,
        max_new_tokens=task.max_answer_chars + 1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # out: [B, P + T]
    texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return task.score(texts, [p.answer for p in problems]).mean().item()


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path, meta: dict) -> None:
    """Safetensors weights (fp32 if small enough, else bf16), tokenizer, sft_meta.json and README.md."""
    out.mkdir(parents=True, exist_ok=True)
    fp32_bytes = sum(p.numel() * 4 for p in model.parameters())
    meta["saved_dtype"] = "float32" if fp32_bytes <= FP32_MAX_BYTES else "bfloat16"
    model.to(torch.float32 if meta["saved_dtype"] == "float32" else torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "sft_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    lines = [
        "# tiny-arith warm-start checkpoint",
        "",
        "Qwen3ForCausalLM (3.2M params) after a supervised warm start on `<bos>a+b=` -> `str(a+b)<eos>`",
        "(2-digit zero-padded operands), stopped at a held-out sampled-accuracy gate so GRPO has signal and room.",
        "Regenerate from the repository root with:",
        "",
        f"    {meta['command']}",
        "",
        "| field | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in meta.items() if k != "command"],
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    task = ArithmeticTask(num_digits=args.num_digits, val_size=args.val_size, seed=args.data_seed)
    val = task.validation()
    tokenizer = build_arith_tokenizer()
    model = build_tiny_model(args.seed).train()
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    start = last_eval = time.perf_counter()
    sampled_acc, passed, step = 0.0, False, 0
    bar = tqdm(total=args.max_steps, desc="sft", unit="step")
    while step < args.max_steps:
        loss = model(**sft_batch(task.train_batch(step, args.batch_size), tokenizer)).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        step += 1
        bar.update(1)
        if time.perf_counter() - last_eval >= args.eval_every_s or step == args.max_steps:
            torch.manual_seed(args.seed * 100_003 + step)  # a check's samples depend on (seed, step), not on timing
            sampled_acc = held_out_accuracy(model, tokenizer, task, val, sample=True)
            last_eval = time.perf_counter()
            passed = sampled_acc >= args.gate
        bar.set_postfix(loss=f"{loss.item():.3f}", sampled_acc=f"{sampled_acc:.3f}")
        if passed:
            break
    bar.close()
    wall_s = time.perf_counter() - start

    torch.manual_seed(args.seed)
    meta = {
        "command": "uv run examples/run_sft.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "seed": args.seed,
        "data_seed": args.data_seed,
        "num_digits": args.num_digits,
        "steps": step,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "gate": args.gate,
        "gate_passed": passed,
        "wall_time_s": round(wall_s, 1),
        "num_threads": args.num_threads,
        "gate_check_sampled_accuracy": round(sampled_acc, 4),
        "held_out_greedy_accuracy": round(held_out_accuracy(model, tokenizer, task, val, sample=False), 4),
        "held_out_sampled_accuracy": round(held_out_accuracy(model, tokenizer, task, val, sample=True), 4),
        "held_out_size": len(val),
        "torch_version": torch.__version__,
    }
    save_checkpoint(model, tokenizer, args.out, meta)
    print(json.dumps(meta, indent=2))
    if not passed:
        print(f"warning: gate {args.gate} not reached in {args.max_steps} steps", file=sys.stderr)
    return meta


if __name__ == "__main__":
    main()
