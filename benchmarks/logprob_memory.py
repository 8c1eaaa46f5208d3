"""Where the trainer's logprob pass (or training pass) spends its memory, against the memory preflight's estimate.

One `NativePolicy.get_logprobs` (`--pass train`: one `NativePolicy.train` step, its optimizer update included) over
`--rows` random sequences of `--seq` tokens at a model shape (random weights),
with a shipped config and overrides as `run_grpo.py` takes them (the preflight first derives its token budgets into
the config, as a run does). Prints the pass's measured peak over what was allocated before it, per token, next to
the estimate's logprob term (`MemoryEstimate.logprob_per_token`, `logprob_fixed`); on CUDA with `--snapshot`, the
largest allocations alive at the peak with the line of this package that made each, the bytes alive then summed by
that line, and the allocation that reached the peak (the allocator's trace).

    python3 -m benchmarks.logprob_memory --shape qwen3-8b --rows 8 --seq 16896 \\
        --config examples/configs/grpo_math_8B_fp8_kv.yaml policy.master_dtype=bfloat16 \\
        policy.dtensor_cfg.activation_checkpointing=true --snapshot

With `--pass train` the estimate printed is the training term (`train_per_token`, `train_fixed`, the micro-batch's
activations and working set over the resident state), and the whole training peak against the measured one (on
CUDA, after the pass); the peak sites then show what an FP8 recipe holds beside BF16's,
and `--steps 2` measures the second step (AdamW's state resident before the pass, as in a run's later steps).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re

import torch
from torch.utils.checkpoint import set_checkpoint_early_stop

from benchmarks.common import build_model, device_info, write_json
from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.algorithms.memory_preflight import memory_preflight
from nemo_jetrl.config import load_config
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.memory_estimate import GIB, ModelShape
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

PACKAGE = "nemo_jetrl"
TOP = 12  # allocations listed at the peak


def random_batch(rows: int, seq: int, vocab: int, seed: int = 0) -> TrainBatch:
    """rows x seq random tokens, every one real (the longest rows a step can hold)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (rows, seq), generator=gen)  # [rows, seq]
    ones = torch.ones_like(ids)
    advantages = torch.linspace(-1.0, 1.0, rows)  # [rows]: a nonzero loss and gradient
    return TrainBatch(ids, ones, ones, advantages, torch.zeros(rows, seq))


def held_tensors(model: torch.nn.Module) -> dict[int, tuple[int, str]]:
    """What the model's modules hold beside their parameters and buffers (FP8 weight caches, weight groups' shared
    buffers, their W^T copies), by storage address: {addr: (bytes, "module.attr...")}, layer indices as `*`."""
    found: dict[int, tuple[int, str]] = {}

    def visit(obj, where: str, depth: int) -> None:
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            found.setdefault(storage.data_ptr(), (storage.nbytes(), re.sub(r"\.\d+\.", ".*.", where)))
        elif depth == 0 or isinstance(obj, torch.nn.Module):
            return
        elif isinstance(obj, (tuple, list)):
            for i, value in enumerate(obj):
                visit(value, f"{where}[{i}]", depth - 1)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                visit(value, f"{where}.{key}", depth - 1)
        else:
            try:
                names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else list(vars(obj))
            except TypeError:  # no attributes: a number, a string, a dtype
                return
            for name in names:
                visit(getattr(obj, name, None), f"{where}.{name}", depth - 1)

    for module_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr not in ("_parameters", "_buffers", "_modules") and not attr.endswith("hooks"):
                visit(value, f"{module_name}.{attr}", 4)
    return found


def peak_allocations(snapshot: dict, device: int, held: dict[int, tuple[int, str]] | None = None) -> dict:
    """Replays the allocator's trace once: at the moment the device held most (the trace's blocks alive less those from
    before it that the pass freed), the trace's bytes alive ("peak"), the TOP largest blocks alive then
    ("largest": size, site) and those blocks summed by site ("sites": bytes, blocks, site; largest first), the site
    whose allocation reached the peak ("reached_by") and how far into the trace it came ("at", 0-1). A block's site
    is the innermost frame of this package (or the innermost frame) that allocated it. Where in a pass the peak is,
    and what two recipes' peaks hold apart. `held` (`held_tensors` before the trace): those of its blocks the pass
    has not freed by the peak, summed by name ("held": bytes, blocks, name), and the bytes of blocks from before the
    trace that it has freed ("freed_before": named or not)."""
    trace = snapshot["device_traces"][device]
    freed = "free_completed" if any(e["action"] == "free_completed" for e in trace) else "free_requested"
    live: dict[int, tuple[int, str]] = {}
    kept = dict(held or {})
    total = best = best_at = released = best_released = 0
    best_live: dict[int, tuple[int, str]] = {}
    best_kept = dict(kept)
    for i, event in enumerate(trace):
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            frames = event.get("frames") or []
            ours = [f for f in frames if PACKAGE in f["filename"]] or frames
            top = ours[0] if ours else None
            where = f"{top['filename'].split(PACKAGE + '/')[-1]}:{top['line']} {top['name']}" if top else "?"
            live[addr] = (size, where)
            total += size
            if total - released > best - best_released:
                best, best_live, best_at, best_kept, best_released = total, dict(live), i, dict(kept), released
        elif action == freed and addr in live:
            total -= live.pop(addr)[0]
        elif action == freed:  # a block from before the trace
            released += size
            kept.pop(addr, None)
    return {
        "peak": best,
        "largest": sorted(best_live.values(), reverse=True)[:TOP],
        "sites": _summed(best_live.values()),
        "reached_by": best_live[trace[best_at]["addr"]][1] if best else "?",
        "at": best_at / max(len(trace) - 1, 1),
        "held": _summed(best_kept.values()),
        "freed_before": best_released,
    }


def _summed(blocks) -> list[tuple[int, int, str]]:
    """(bytes, blocks, name) per name of (size, name) blocks, largest first."""
    sums: dict[str, list[int]] = {}
    for size, where in blocks:
        entry = sums.setdefault(where, [0, 0])
        entry[0] += size
        entry[1] += 1
    return sorted(((b, n, w) for w, (b, n) in sums.items()), reverse=True)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--config", default="examples/configs/grpo_math_8B_fp8_kv.yaml")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq", type=int, default=16896)
    p.add_argument("--pass", dest="pass_", choices=("logprob", "train"), default="logprob", help="which pass")
    p.add_argument("--snapshot", action="store_true", help="CUDA: list the allocations alive at the peak")
    p.add_argument("--steps", type=int, default=1, help="--pass train: measure the last of this many steps (2: "
                   "with the optimizer's state resident before the pass, as in every step after a run's first)")
    p.add_argument("--out", default=None, help="JSON output path")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fields = {**SHAPES[args.shape], **({"num_hidden_layers": args.layers} if args.layers else {})}
    overrides = [f"policy.max_total_sequence_length={args.seq}", *args.overrides]
    # one process on one device, as benchmarks/gpu_cli_run.sh runs a shipped recipe
    cpu = device.type == "cpu"
    overrides += ["cluster.device=cpu", "cluster.gpus_per_node=0"] if cpu else ["cluster.gpus_per_node=1"]
    cfg = validate_config(load_config(args.config, overrides))
    shape = ModelShape.from_config(fields)
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    preflight = memory_preflight(cfg, shape=shape, capacity=capacity)  # derives the budgets as a run does
    est = preflight.estimate
    if est is None:
        p.error(f"no estimate to compare with: {preflight.line}")
    dtype = torch.bfloat16 if cfg.policy.master_dtype == "bfloat16" else torch.float32
    model = build_model(fields, args.layers, device, dtype).train()
    policy = NativePolicy(cfg.policy, PrecisionRecipe.from_config(cfg.policy), device, model=model)
    batch = random_batch(args.rows, args.seq, fields["vocab_size"])
    warm = random_batch(1, min(256, args.seq), fields["vocab_size"], seed=1)
    if policy.kv_calibrator is not None:  # an FP8 KV recipe's first K/V scales, as a run's first step makes them
        policy.calibrate_kv_scales(warm)
    policy.get_logprobs(warm)  # compilation, FP8 caches: not measured
    if args.pass_ == "train":
        loss_fn = ClippedPGLossFn(cfg.loss_fn)
        if cfg.policy.prev_logprobs_source != "train_forward":  # a separate logprob pass's (unmeasured)
            batch.prev_logprobs = batch.generation_logprobs.clone()  # [rows, seq]
        for _ in range(args.steps - 1):  # earlier steps: AdamW's state is resident from here on, as from step 2
            policy.train([copy.deepcopy(batch)], loss_fn)
            policy.get_logprobs(warm)  # the next step's FP8 caches of the new weights, as its logprob pass makes them
        run, per_token, fixed = (lambda: policy.train([batch], loss_fn)), est.train_per_token, est.train_fixed
    else:
        run, per_token, fixed = (lambda: policy.get_logprobs(batch)), est.logprob_per_token, est.logprob_fixed
    result = {
        **device_info(device), "shape": args.shape, "layers": fields["num_hidden_layers"], "rows": args.rows,
        "seq": args.seq, "tokens": args.rows * args.seq, "pass": args.pass_, "steps": args.steps,
        "preflight": preflight.line,
        "estimate_per_token_bytes": per_token, "estimate_fixed_bytes": fixed,
    }  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        if args.snapshot:
            held = held_tensors(model)  # the FP8 caches before the pass: which the pass still holds at its peak
            torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")  # Python frames only
        # while the trace records, a checkpointed recomputation's early stop (an exception torch raises to end it)
        # surfaced as a SystemError in an autograd Function on torch 2.11, with C++ stacks and with Python frames
        # only (docs/long_responses.md): traced, each recomputation runs whole
        with set_checkpoint_early_stop(not args.snapshot):
            run()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        result |= {"allocated_before_gib": before / GIB, "pass_peak_gib": peak / GIB,
                   "pass_peak_per_token_bytes": peak / result["tokens"]}  # fmt: skip
        if args.snapshot:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            at_peak = peak_allocations(snap, device.index or 0, held)
            result["peak_allocations"] = [{"gib": size / GIB, "site": where} for size, where in at_peak["largest"]]
            result["peak_reached_by"], result["peak_at_fraction"] = at_peak["reached_by"], at_peak["at"]
            result["peak_sites"] = [{"gib": b / GIB, "blocks": n, "site": w} for b, n, w in at_peak["sites"]]
            result["held_at_peak"] = [{"gib": b / GIB, "blocks": n, "name": w} for b, n, w in at_peak["held"]]
            result["freed_before_gib"] = at_peak["freed_before"] / GIB
    else:
        run()
    est_pass = fixed + per_token * result["tokens"]
    print(f"{args.pass_} pass on {result['device']}: {args.shape} x {result['layers']} layers, {args.rows} x "
          f"{args.seq} tokens | estimate {est_pass / GIB:.2f} GiB ({per_token / 1024:.1f} KiB/token + "
          f"{fixed / GIB:.2f} GiB)", flush=True)  # fmt: skip
    if "pass_peak_gib" in result:
        print(f"measured peak over the {result['allocated_before_gib']:.2f} GiB before it: "
              f"{result['pass_peak_gib']:.2f} GiB ({result['pass_peak_per_token_bytes'] / 1024:.1f} KiB/token)", flush=True)  # fmt: skip
        if args.pass_ == "train":  # the whole peak; the estimate counts every gradient, as a step's second
            # micro-batch holds them: this one-micro-batch pass peaks below it by the decoder's (docs/long_responses.md)
            result["estimate_peak_gib"] = est.peak("train", result["tokens"]) / GIB
            result["measured_peak_gib"] = result["allocated_before_gib"] + result["pass_peak_gib"]
            off = result["estimate_peak_gib"] / result["measured_peak_gib"] - 1
            print(f"training peak: estimated {result['estimate_peak_gib']:.2f} GiB, measured "
                  f"{result['measured_peak_gib']:.2f} GiB ({off:+.1%})")  # fmt: skip
    for row in result.get("peak_allocations", []):
        print(f"  {row['gib']:8.3f} GiB  {row['site']}")
    if "peak_sites" in result:
        print(
            f"alive at the peak by site (reached by {result['peak_reached_by']}, "
            f"{result['peak_at_fraction']:.0%} into the pass):"
        )
        for row in result["peak_sites"][: 2 * TOP]:
            print(f"  {row['gib']:8.3f} GiB  {row['blocks']:5d} blocks  {row['site']}")
        print(f"held from before the pass at the peak ({result['freed_before_gib']:.3f} GiB of it freed by then):")
        for row in result["held_at_peak"][:TOP]:
            print(f"  {row['gib']:8.3f} GiB  {row['blocks']:5d} blocks  {row['name']}")
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
