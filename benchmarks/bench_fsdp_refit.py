#!/usr/bin/env python3
"""FSDP2 + FP8 training + FP8 all-gather refit: refit bytes/time BF16 vs FP8, train step time 1 -> N GPUs.

    python3 -m benchmarks.bench_fsdp_refit --out results/fsdp_refit.json            # 1 and 2 GPUs, Qwen3-1.7B shape
    python3 -m benchmarks.bench_fsdp_refit --device cpu --model tiny --gpus 1,2 --out /tmp/x.json   # CPU smoke (gloo)

Without torchrun env it launches itself (`-m benchmarks.bench_fsdp_refit`, from the repo root) once per world size with
`python -m torch.distributed.run` (PyTorch's launcher) and merges the results. Each rank holds the trainer of its
rank (`NativePolicy` on the "fsdp" parallel plan): an FSDP2 shard of a randomly initialized causal LM (FP32 master,
blockwise-FP8 FProp/DGrad/WGrad) plus a rollout replica refit by all-gathering FP8 bits + scales, the very bits the
trainer's forward reads. Same global batch at every world size (strong scaling). Needs torch + transformers only (no
Ray, OmegaConf,
pydantic): nemo_jetrl.config is never imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    # Qwen3-1.7B shape: 1.41B linear params in 28 layers + 311M tied embedding = 1.72B
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=128, vocab_size=512),
}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSON results")
    p.add_argument("--model", choices=sorted(MODELS), default="1.7b")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--gpus", default="1,2", help="world sizes to run (comma list)")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up step)")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per step (all ranks)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--refit-reps", type=int, default=5)
    p.add_argument("--rollout-prompts", type=int, default=16)
    p.add_argument("--rollout-tokens", type=int, default=64)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------- launcher
def launch(args: argparse.Namespace) -> int:
    import torch

    sizes = [int(s) for s in args.gpus.split(",") if s.strip()]
    if args.device == "cuda":
        have = torch.cuda.device_count()
        if have == 0:
            raise SystemExit("no CUDA device visible (use --device cpu for the CPU smoke run)")
        sizes = [n for n in sizes if n <= have] or [have]
    runs = {}
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "result.json"
            passthrough = _drop_option(sys.argv[1:], "--out")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                   "-m", "benchmarks.bench_fsdp_refit", *passthrough, "--out", str(args.out), "--worker",
                   "--result", str(result)]  # fmt: skip
            print(f"[bench_fsdp_refit] world size {n}: {' '.join(cmd)}", flush=True)
            proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
            if proc.returncode != 0 or not result.is_file():
                runs[str(n)] = {"error": f"torchrun exited with {proc.returncode}"}
                continue
            runs[str(n)] = json.loads(result.read_text())
    summary = summarize(runs)
    payload = {"benchmark": "fsdp_refit", "model": args.model, "device": args.device, "args": _args_dict(args),
               "runs": runs, "summary": summary}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if all("error" not in r for r in runs.values()) else 1


def _drop_option(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if a.startswith(name + "="):
            continue
        out.append(a)
    return out


def _args_dict(args) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("worker", "result")}


def summarize(runs: dict) -> dict:
    ok = {int(k): v for k, v in runs.items() if "error" not in v}
    out: dict = {}
    for n, r in sorted(ok.items()):
        out[f"{n}_gpu"] = {
            "train_step_s": r["train_step_median_s"],
            "train_tokens_per_s": r["train_tokens_per_s"],
            "allgather_bytes_per_step": r["allgather_bytes_per_step"][-1] if r["allgather_bytes_per_step"] else 0,
            "max_mem_gb": r.get("max_mem_gb"),
        }
        if not r["refit"]:  # one GPU: no refit (the rollout runs on the trainer's own modules)
            continue
        fp8, bf16 = r["refit"]["fp8"], r["refit"]["bf16"]
        out[f"{n}_gpu"] |= {
            "refit_fp8_bytes": fp8["fp8_weight_bytes"] + fp8["other_bytes"],
            "refit_bf16_bytes": bf16["fp8_weight_bytes"] + bf16["other_bytes"],
            "refit_fp8_s": fp8["seconds_median"],
            "refit_bf16_s": bf16["seconds_median"],
            "refit_linear_bytes_ratio": fp8["fp8_weight_bytes"] / bf16["fp8_weight_bytes"],
            "refit_total_bytes_ratio": (fp8["fp8_weight_bytes"] + fp8["other_bytes"])
            / (bf16["fp8_weight_bytes"] + bf16["other_bytes"]),
            "refit_time_ratio": fp8["seconds_median"] / bf16["seconds_median"],
            "refit_bits_equal_trainer": r["refit_bits_equal"],
        }
    if 1 in ok:
        for n in sorted(ok):
            if n > 1:
                t1, tn = ok[1]["train_step_median_s"], ok[n]["train_step_median_s"]
                out[f"train_speedup_1_to_{n}"] = t1 / tn
                out[f"scaling_efficiency_1_to_{n}"] = t1 / (n * tn)
    return out


# ---------------------------------------------------------------------------------------------------- worker
def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from benchmarks.common import LOSS, policy_config
    from nemo_jetrl.generation.native.engine import NativeGenerationEngine
    from nemo_jetrl.policy.interfaces import TrainBatch
    from nemo_jetrl.policy.native import NativePolicy
    from nemo_jetrl.policy.parallel.plan import ParallelPlan
    from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, weight_quant
    from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear

    world = int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    if args.global_batch % (world * args.micro_batch):
        raise SystemExit(f"--global-batch {args.global_batch} must divide into {world} x --micro-batch")
    cfg = Qwen3Config(**MODELS[args.model], tie_word_embeddings=True, max_position_embeddings=args.seq_len + 256,
                      dtype="float32")  # fmt: skip
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).float()
    n_params = sum(p.numel() for p in model.parameters())
    policy_cfg = policy_config(
        train_micro_batch_size=args.micro_batch,
        logprob_batch_size=args.micro_batch,
        max_total_sequence_length=args.seq_len + args.rollout_tokens,
        generation={"max_new_tokens": args.rollout_tokens, "cuda_graphs": False},
    )
    plan = ParallelPlan.from_process_group(device)
    policy = NativePolicy(policy_cfg, PrecisionRecipe.preset("jetrl"), device, plan=plan, model=model)
    if policy.refitter is not None:  # one GPU: the one-process trainer, the rollout on its own modules
        policy.refitter.other_dtype = torch.bfloat16  # non-FP8 tensors travel as BF16 in both formats
    _sync(device)
    setup_s = time.perf_counter() - t0
    linear_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, Fp8Linear))

    # ---- refit: FP8 (bits + scales) vs the BF16 baseline (master in BF16, every rank re-quantizes)
    refit: dict = {}
    bits_equal = True
    for fmt in ("fp8", "bf16", "fp8") if policy.refitter is not None else ():  # the last fp8: the trainer's bits
        policy.refitter.refit(fmt)  # warm-up
        stats = [policy.refitter.refit(fmt).metrics() for _ in range(args.refit_reps)]
        refit[fmt] = {**stats[-1], "seconds_median": statistics.median(s["seconds"] for s in stats)}
    names = [n for n, m in model.named_modules() if isinstance(m, Fp8Linear)]
    for name in (names[0], names[-1]) if policy.refitter is not None else ():
        w = model.get_submodule(name).weight
        full = w.full_tensor() if hasattr(w, "full_tensor") else w
        data, scale = weight_quant(full.detach())
        target = policy.rollout_model.get_submodule(name)
        assert isinstance(target, Fp8RolloutLinear)
        bits_equal &= torch.equal(target.weight_fp8.view(torch.uint8), data.view(torch.uint8))
        bits_equal &= torch.equal(target.weight_scale, scale)

    # ---- synthetic global batch (same on every rank), this rank's contiguous micro-batches
    gen = torch.Generator().manual_seed(1)
    b, s = args.global_batch, args.seq_len
    ids = torch.randint(2, cfg.vocab_size, (b, s), generator=gen)
    attn = torch.ones(b, s, dtype=torch.long)
    resp = torch.zeros(b, s, dtype=torch.long)
    resp[:, s // 2 :] = 1
    batch = TrainBatch(ids, attn, resp, torch.randn(b, generator=gen), torch.zeros(b, s))
    _sync(device)
    t0 = time.perf_counter()
    batch.prev_logprobs = policy.get_logprobs(batch)  # each rank its contiguous micro-batches, gathered
    _sync(device)
    logprob_s = time.perf_counter() - t0
    step_s, refit_after_step_s, grad_norms, gather_bytes = [], [], [], []
    for step in range(args.steps + 1):
        _sync(device)
        t0 = time.perf_counter()
        out = policy.train(batch, LOSS)
        _sync(device)
        t1 = time.perf_counter()
        refit_metrics = policy.prepare_refit()
        t2 = time.perf_counter()
        if step > 0:  # step 0 is the warm-up
            step_s.append(t1 - t0)
            refit_after_step_s.append(t2 - t1)
            grad_norms.append(out["grad_norm"])
            gather_bytes.append(refit_metrics.get("allgather_bytes", 0.0))

    # ---- a short rollout on the refit replica
    prompts = [[2 + (i * 7 + j) % (cfg.vocab_size - 2) for j in range(32)] for i in range(args.rollout_prompts)]
    _sync(device)
    t0 = time.perf_counter()
    engine = NativeGenerationEngine(
        policy.rollout_model, max_new_tokens=args.rollout_tokens, stop_token_ids=[1], pad_token_id=0,
        compute_dtype=policy.compute_dtype, kv_cache_dtype=None, device=device,
    )  # fmt: skip
    gen_out = engine.generate(prompts, greedy=False, generator=torch.Generator(device=device).manual_seed(123))
    _sync(device)
    rollout_s = time.perf_counter() - t0
    tokens = int(gen_out.response_mask.sum())

    result = {
        "world_size": world,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "params": n_params,
        "fp8_linear_params": linear_params,
        "setup_s": setup_s,
        "refit": refit,
        "refit_bits_equal": bool(bits_equal),
        "logprob_s": logprob_s,
        "train_step_s": step_s,
        "train_step_median_s": statistics.median(step_s),
        "train_tokens_per_s": b * s / statistics.median(step_s),
        "refit_after_step_s": refit_after_step_s,
        "grad_norms": grad_norms,
        "allgather_bytes_per_step": gather_bytes,
        "rollout_tokens": tokens,
        "rollout_tokens_per_s": tokens / rollout_s,
        "max_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    if dist.get_rank() == 0:
        args.result.write_text(json.dumps(result, indent=2))
        line = f"[bench_fsdp_refit] world {world}: step {result['train_step_median_s']:.3f}s"
        if refit:
            line += (f", refit fp8 {refit['fp8']['seconds_median']:.4f}s vs bf16 {refit['bf16']['seconds_median']:.4f}s, "
                     f"bytes ratio {refit['fp8']['fp8_vs_bf16_bytes']:.4f}, bits equal {bits_equal}")  # fmt: skip
        print(line, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.worker:
        worker(arguments)
    else:
        sys.exit(launch(arguments))
