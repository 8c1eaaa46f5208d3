"""The lm_head + token-logprob segment of a trainer micro-batch, fused logprob vs the float32 twin (GPU).

    python3 -m benchmarks.bench_logprob --tokens 4096 --out logprob.json

One micro-batch of `--tokens` tokens at the Qwen3-8B shape (hidden 4096, vocabulary 151936, BF16 lm_head):
logits = h @ W^T, logprobs of random targets (`models.logprobs.token_logprobs`, fused=True / False), a weighted sum
as the loss, backward to h and W. Variants alternate, `--steps` timed after `--warmup`; median, min-max and the
step's peak memory above what was allocated before it. Also checks the two variants' logprobs and gradients agree.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import QWEN3_8B, alternating_timings, parse_gpu_bench, report
from nemo_jetrl.models.logprobs import token_logprobs


def main(argv: list[str] | None = None) -> str | None:
    parser = argparse.ArgumentParser(prog="bench_logprob.py", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parsed = parse_gpu_bench(parser, argv)
    if parsed is None:
        return None
    args, dev, info = parsed
    hidden, vocab = QWEN3_8B["hidden_size"], QWEN3_8B["vocab_size"]
    torch.manual_seed(0)
    h = (torch.randn(args.tokens, hidden, device=dev) * 0.5).to(torch.bfloat16).requires_grad_(True)  # [T, H]
    w = (torch.randn(vocab, hidden, device=dev) * 0.02).to(torch.bfloat16).requires_grad_(True)  # [V, H]
    targets = torch.randint(0, vocab, (args.tokens,), device=dev)  # [T]
    weights = torch.randn(args.tokens, device=dev)  # [T] stands in for advantages / normalizer

    def step(fused: bool):
        h.grad = w.grad = None
        logp = token_logprobs(h @ w.t(), targets, args.temperature, fused=fused)  # [T]
        (logp * weights).sum().backward()
        return logp.detach()

    fused_lp = step(True)
    fused_grad = h.grad.clone()  # [T, H]
    twin_lp = step(False)
    twin_grad = h.grad.clone()
    agree = {
        "logprob_max_abs_diff": float((fused_lp - twin_lp).abs().max()),
        "grad_h_rel_diff": float((fused_grad.float() - twin_grad.float()).norm() / twin_grad.float().norm()),
    }
    print(agree, flush=True)
    timings = alternating_timings(
        {"twin (float32 logits)": lambda: step(False), "fused": lambda: step(True)}, args.warmup, args.steps, dev
    )
    base = timings["twin (float32 logits)"]["median_s"]
    results = [
        {"variant": name, **r, "speedup": base / r["median_s"], "tokens": args.tokens} for name, r in timings.items()
    ]
    for r in results:
        r["ms"] = f"{1e3 * r['median_s']:.2f} ({1e3 * r['min_s']:.2f}-{1e3 * r['max_s']:.2f})"
    title = f"lm_head + logprob fwd+bwd, {args.tokens} tokens, vocab {vocab} on {info['device']}"
    return report(
        title, ["variant", "ms median (min-max)", "x twin", "step peak GB"], ["variant", "ms", "speedup", "step_peak_gb"],
        results, args=args, info=info, shape={"hidden_size": hidden, "vocab_size": vocab}, n_layers=0, agreement=agree,
    )  # fmt: skip


if __name__ == "__main__":
    main()
