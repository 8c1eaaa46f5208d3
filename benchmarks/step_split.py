"""A training step's kernel time split into per-layer and per-step parts, and the FP8 step's ceiling.

Profiles of the same step at two depths a < b (`profile_train_step.py --layers a b`) give, per kernel family,
T(L) = per_layer * L + per_step (lm_head, loss, embedding and the optimizer's fixed part land in per_step). From that
split, at any depth L:
- the step as measured, per variant, and its ratio to BF16;
- the linears alone: BF16's decoder GEMMs against FP8's GEMMs + quantizers + transposed copies, per layer;
- the ceiling: the FP8 step if its decoder GEMMs ran at the hardware's FP8 : BF16 peak ratio (H100 / H200 dense
  tensor cores: 1,979 : 989 TFLOP/s, 2x) of BF16's and its quantizers and copies cost nothing, every other kernel as
  measured. No FP8 GEMM library reaches that ratio at these shapes, so this bounds what any kernel work can buy.

    python3 -m benchmarks.step_split PROFILE.json --plot split.png   # re-draw a saved split (profile_train_step)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

PEAK_RATIO = 2.0  # FP8 : BF16 dense tensor-core peak on Hopper
FP8_ONLY = ("quantize", "copy/cat")  # the families FP8 adds around its GEMMs (BF16's own copies are subtracted)

Families = Mapping[str, float]  # kernel family -> ms of one step


def split(at_a: Families, layers_a: int, at_b: Families, layers_b: int) -> dict[str, tuple[float, float]]:
    """{family: (ms per layer, ms per step)} from one variant's profiles at two depths."""
    if layers_b <= layers_a:
        raise ValueError(f"split: need two depths a < b, got {layers_a} and {layers_b}")
    out = {}
    for fam in sorted(set(at_a) | set(at_b)):
        ta, tb = at_a.get(fam, 0.0), at_b.get(fam, 0.0)
        per_layer = (tb - ta) / (layers_b - layers_a)
        out[fam] = (per_layer, ta - per_layer * layers_a)
    return out


def at_depth(parts: Mapping[str, tuple[float, float]], layers: int) -> dict[str, float]:
    """{family: ms} of the step at `layers` layers."""
    return {fam: per_layer * layers + per_step for fam, (per_layer, per_step) in parts.items()}


def linears_per_layer(parts: Mapping[str, tuple[float, float]], bf16: Mapping[str, tuple[float, float]]) -> float:
    """ms per layer of a variant's decoder linears: GEMMs (FP8 and BF16) plus what FP8 adds around them."""
    own = sum(parts.get(fam, (0.0, 0.0))[0] for fam in ("fp8 gemm", "bf16 gemm"))
    added = sum(parts.get(fam, (0.0, 0.0))[0] - bf16.get(fam, (0.0, 0.0))[0] for fam in FP8_ONLY)
    return own + max(added, 0.0)


def ceiling(fp8: Mapping[str, tuple[float, float]], bf16: Mapping[str, tuple[float, float]], layers: int) -> float:
    """ms of the FP8 step at `layers` with its decoder GEMMs at PEAK_RATIO x BF16's and nothing FP8-only."""
    step = at_depth(fp8, layers)
    bf16_step = at_depth(bf16, layers)
    decoder_gemm_ms = bf16["bf16 gemm"][0] * layers  # BF16's per-layer GEMMs (its lm_head is per step)
    ideal = fp8.get("bf16 gemm", (0.0, 0.0))[1]  # the FP8 variant's lm_head: its per-step BF16 GEMM time
    ideal += decoder_gemm_ms / PEAK_RATIO
    ideal += sum(ms for fam, ms in step.items() if fam not in ("fp8 gemm", "bf16 gemm", *FP8_ONLY))
    ideal += sum(bf16_step.get(fam, 0.0) for fam in FP8_ONLY)  # the copies BF16 makes too
    return ideal


def report(profiles: Mapping[int, Mapping[str, Families]], layers: int) -> tuple[str, dict]:
    """Text table and JSON record from {depth: {variant: families}} (two depths, a 'bf16' variant)."""
    (la, at_a), (lb, at_b) = sorted(profiles.items())
    if "bf16" not in at_a:
        raise ValueError("step_split.report: the profiles need a 'bf16' variant as the baseline")
    parts = {v: split(at_a[v], la, at_b[v], lb) for v in at_a}
    bf16 = parts["bf16"]
    names = list(parts)
    fams = sorted({f for p in parts.values() for f in p}, key=lambda f: -bf16.get(f, (0.0, 0.0))[0])
    lines = [f"per layer ms (from {la} and {lb} layers) | " + " | ".join(names)]
    lines += [f"  {fam:<14} " + " ".join(f"{parts[v].get(fam, (0.0, 0.0))[0]:9.2f}" for v in names) for fam in fams]
    lines.append("per step ms (lm_head, loss, optimizer's fixed part)")
    lines += [f"  {fam:<14} " + " ".join(f"{parts[v].get(fam, (0.0, 0.0))[1]:9.2f}" for v in names) for fam in fams]
    bf16_ms = sum(at_depth(bf16, layers).values())
    bf16_linears = linears_per_layer(bf16, bf16)
    record = {"depths": [la, lb], "layers": layers, "peak_ratio": PEAK_RATIO, "variants": {}}
    lines.append(f"at {layers} layers: step kernel ms, x bf16 | linears per layer x bf16 | ceiling ms, x bf16")
    for v in names:
        ms = sum(at_depth(parts[v], layers).values())
        lin = linears_per_layer(parts[v], bf16)
        top = ceiling(parts[v], bf16, layers) if v != "bf16" else ms
        record["variants"][v] = {
            "step_ms": ms, "x_bf16": bf16_ms / ms, "linears_ms_per_layer": lin, "linears_x_bf16": bf16_linears / lin,
            "ceiling_ms": top, "ceiling_x_bf16": bf16_ms / top, "per_layer": {f: p[0] for f, p in parts[v].items()},
            "per_step": {f: p[1] for f, p in parts[v].items()},
        }  # fmt: skip
        lines.append(
            f"  {v:<12} {ms:9.1f} {bf16_ms / ms:6.3f}x | {lin:7.2f} ms {bf16_linears / lin:6.3f}x"
            f" | {top:9.1f} {bf16_ms / top:6.3f}x"
        )
    return "\n".join(lines), record


# kernel families drawn together: what a layer spends per optimizer step
PLOT_GROUPS = {
    "decoder GEMMs": ("fp8 gemm", "bf16 gemm"),
    "FP8 quantizers + copies": FP8_ONLY,
    "attention": ("attention",),
    "glue + elementwise": ("glue", "elementwise", "reduce/finite", "other"),
    "optimizer": ("optimizer",),
}


def plot(record: Mapping, path: str | Path, device: str = "") -> None:
    """Stacked bars of each variant's kernel ms per layer (from `report`'s record), the ceilings in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.plot_performance import stacked_bars

    variants = record["variants"]
    labels = [v.replace(":", "\n").replace("+", "\n+") for v in variants]
    parts = [
        {group: max(sum(r["per_layer"].get(f, 0.0) for f in fams), 0.0) for group, fams in PLOT_GROUPS.items()}
        for r in variants.values()
    ]
    fig, ax = plt.subplots(figsize=(2.2 + 1.3 * len(labels), 4.2))
    stacked_bars(ax, labels, parts)
    for i, r in enumerate(variants.values()):
        total = sum(parts[i].values())
        note = "" if i == 0 else f"ceiling {r['ceiling_x_bf16']:.2f}x"
        ax.text(i, total, note, ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("kernel ms per layer and optimizer step")
    ax.set_title(f"{device + ': ' if device else ''}per layer, from {record['depths'][0]} and {record['depths'][1]} "
                 f"layers; ceiling at {record['layers']} layers: FP8 GEMMs at {record['peak_ratio']:g}x BF16's, "
                 "no quantizers")  # fmt: skip
    ax.title.set_fontsize(8)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="re-draw a saved per-layer split (profile_train_step.py --layers A B)")
    p.add_argument("profile", help="JSON written by profile_train_step.py --layers A B --out")
    p.add_argument("--plot", required=True, help="PNG to write")
    args = p.parse_args(argv)
    payload = json.loads(Path(args.profile).read_text())
    if "split" not in payload:
        p.error(f"{args.profile}: no per-layer split (profiled at one depth)")
    plot(payload["split"], args.plot, device=payload.get("device", ""))
    print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
