"""SFT stage of the accuracy study (docs/accuracy.md): a Qwen3 trained from scratch on worked long-addition solutions.

A fresh `Qwen3ForCausalLM` (`SHAPES`) with a character-level tokenizer learns the column-by-column scratchpad of
`environments/long_addition.py` (loss on the response: scratchpad, answer and eos), FP32 master weights, BF16
autocast on CUDA. Every `eval_every` steps the held-out greedy accuracy (the GRPO loop's own rollout engine,
`NativeGenerationEngine`) is checked against `gate`: training stops at the first check that passes it, so GRPO starts
from a model that is partly right. Checks happen at fixed steps, so the stopping step depends on the seeds only.
Writes an HF directory (weights, tokenizer, sft_meta.json, sft_curve.jsonl, sft_corpus_sample.jsonl) that
`policy.model_name` can name. Used by examples/accuracy_study.py (`sft` stage).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from nemo_jetrl.environments.long_addition import ALPHABET, VOCAB_SIZE, LongAdditionTask
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer

# study: the GPU model of docs/accuracy.md; quick: a CPU smoke model. Every linear dim is a multiple of 128 (FP8 blocks).
SHAPES: dict[str, dict[str, int]] = {
    "study": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=128),
    "quick": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=128),
}  # fmt: skip
CORPUS_SAMPLE_ROWS = 256


def model_config(shape: dict[str, int], max_positions: int) -> Qwen3Config:
    """Qwen3 config of `shape` over the long-addition character vocabulary (tied embeddings)."""
    return Qwen3Config(
        architectures=["Qwen3ForCausalLM"],
        vocab_size=VOCAB_SIZE,
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


def sft_batch(task: LongAdditionTask, problems, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
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


def held_out_accuracy(engine: NativeGenerationEngine, tokenizer, task: LongAdditionTask, problems) -> float:
    """Greedy exact-answer accuracy on `problems`, decoded as the GRPO loop decodes."""
    out = engine.generate([tokenizer(p.prompt).input_ids for p in problems], greedy=True)
    texts = [
        tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
        for ids, mask in zip(out.input_ids, out.response_mask)
    ]
    return float((task.score(texts, [p.answer for p in problems]) > 0.5).float().mean())


def lr_at(step: int, lr: float, warmup: int, total: int) -> float:
    """Linear warm-up to `lr`, then cosine decay to lr / 10 at `total` steps."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def write_corpus_sample(path: Path, task: LongAdditionTask, rows: int) -> None:
    """The first `rows` SFT examples (training batch 0) as jsonl: prompt, solution, answer."""
    with path.open("w") as f:
        for prob in task.train_batch(0, rows):
            f.write(json.dumps({"prompt": prob.prompt, "solution": task.solution(prob), "answer": prob.answer}) + "\n")


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
) -> dict[str, Any]:
    """Train, gate, save under `out`; returns the metadata written to sft_meta.json."""
    task = LongAdditionTask(num_digits=num_digits, val_size=max(gate_size, 512), seed=data_seed)
    max_len = 1 + 3 * num_digits + 1 + task.max_response_chars + 1  # bos, columns, '=', solution, eos
    tokenizer = build_char_tokenizer(ALPHABET, VOCAB_SIZE, model_max_length=max_len)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(model_config(SHAPES[shape], max_positions=max_len)).to(device).train()
    num_params = sum(p.numel() for p in model.parameters())
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=device.type == "cuda")
    engine = NativeGenerationEngine(
        model, max_new_tokens=task.max_response_chars + 1, stop_token_ids=[EOS_ID], pad_token_id=PAD_ID,
        compute_dtype=torch.bfloat16, device=device, cuda_graphs=device.type == "cuda",
    )  # fmt: skip
    gate_problems = task.validation(gate_size)
    out.mkdir(parents=True, exist_ok=True)
    curve = (out / "sft_curve.jsonl").open("w")
    start = time.perf_counter()
    step, accuracy, passed, loss_value = 0, 0.0, False, math.nan
    while step < max_steps and not passed and time.perf_counter() - start < max_time_s:
        input_ids, labels = (t.to(device) for t in sft_batch(task, task.train_batch(step, batch_size), tokenizer))
        for group in optim.param_groups:
            group["lr"] = lr_at(step, lr, warmup, max_steps)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=input_ids, labels=labels).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        step += 1
        if step % eval_every == 0 or step == max_steps:
            loss_value = float(loss.detach())
            model.eval()
            accuracy = held_out_accuracy(engine, tokenizer, task, gate_problems)
            model.train()
            passed = accuracy >= gate
            row = {"step": step, "loss": round(loss_value, 5), "greedy_accuracy": accuracy,
                   "wall_s": round(time.perf_counter() - start, 1)}  # fmt: skip
            curve.write(json.dumps(row) + "\n")
            curve.flush()
            print(f"sft step {step}: loss {loss_value:.4f} held-out greedy accuracy {accuracy:.3f}", flush=True)
    curve.close()
    wall_s = time.perf_counter() - start
    model.eval().to(torch.float32).save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_corpus_sample(out / "sft_corpus_sample.jsonl", task, CORPUS_SAMPLE_ROWS)
    meta = {
        "shape": shape, **SHAPES[shape], "vocab_size": VOCAB_SIZE, "num_parameters": num_params,
        "num_digits": num_digits, "data_seed": data_seed, "seed": seed, "batch_size": batch_size, "lr": lr,
        "steps": step, "gate": gate, "gate_passed": passed, "gate_size": gate_size,
        "gate_greedy_accuracy": accuracy, "final_loss": loss_value, "wall_time_s": round(wall_s, 1),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
    }  # fmt: skip
    (out / "sft_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta
