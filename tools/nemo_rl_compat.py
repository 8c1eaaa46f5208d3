#!/usr/bin/env python
"""Write docs/nemo_rl.md's generated sections: the key table (from config/nemo_rl_keys.py) and the compatibility
table of a NeMo-RL snapshot's whole GRPO / DAPO tree.

    python tools/nemo_rl_compat.py keys                          # the key table (tests keep it in sync)
    python tools/nemo_rl_compat.py tree /path/to/NeMo-RL --commit SHA [--verify 5]

`tree` validates every `examples/configs/**/{grpo,dapo}*.yaml` of the snapshot as a NeMo-RL user runs it, from the
snapshot's root (so its relative `prompt_file` paths resolve), in this process: what
`uv run --project <repo> <repo>/examples/run_grpo.py --config <file> --validate-only` does. `--verify N` also runs
N of the files (spread over the tree) through that very command and checks that it gives the same outcome.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "nemo_rl.md"
KEYS_BEGIN, KEYS_END = "<!-- key table: tools/nemo_rl_compat.py keys -->", "<!-- end of key table -->"
TREE_BEGIN, TREE_END = "<!-- compatibility table: tools/nemo_rl_compat.py tree -->", "<!-- end of compatibility table -->"
# MoE by model or file name: <total>B-A<active>B, and the MoE families of the tree
MOE = re.compile(r"(?i)(\d+b-?a\d+b|deepseek-v3|dsv3|gpt-?oss|glm-?4\.?7-?flash|glm-?5|minimax|moonlight|qwen3-235b)")
# the MoE family built here (Qwen3MoeForCausalLM): Qwen3-30B-A3B / Qwen3-235B-A22B by model or file name
QWEN3_MOE = re.compile(r"(?i)(qwen3-(30b-?a3b|235b)|qwen3?-?30ba3b)")
# expert-parallel sizes (refused until expert parallelism exists): set to 1 for the "with EP 1" outcome
EP_KEYS = (
    "policy.megatron_cfg.expert_model_parallel_size",
    "policy.megatron_cfg.expert_tensor_parallel_size",
    "policy.dtensor_cfg.expert_parallel_size",
    "policy.generation.vllm_cfg.expert_parallel_size",
)
SECTIONS = {
    "honoured": "Honoured (mapped onto our key, NeMo-RL's meaning)",
    "megatron": "Megatron (`policy.megatron_cfg.enabled: true`, schema/nemo_rl_megatron.py)",
    "refused": "Refused unless neutral (value-dependent)",
    "announced": "Accepted; other values run with one start-up line",
    "no_effect": "Accepted, no effect here",
}


def _section(rule) -> str:
    if rule.kind == "same_as" and rule.announce or rule.kind == "no_effect" and rule.announce:
        return "announced"
    if rule.kind == "honoured" and rule.refused:
        return "refused"
    return "refused" if rule.kind == "same_as" else rule.kind


def render_key_table() -> str:
    """The key table section of docs/nemo_rl.md, markers included."""
    sys.path.insert(0, str(REPO))
    from nemo_jetrl.config.nemo_rl_facts import pinned_commit
    from nemo_jetrl.config.nemo_rl_keys import KEY_RULES
    from nemo_jetrl.schema.nemo_rl import nemo_rl_only

    lines = [
        KEYS_BEGIN,
        "",
        f"Keys NeMo-RL defines at {pinned_commit()[:12]} (`nemo_jetrl/config/nemo_rl_defined_keys.txt`, written by",
        "`tools/nemo_rl_snapshot.py`) that are not fields of our schema; every one has a line here (patterns: `*` is",
        "any rest of the key). A key below one of NeMo-RL's own sections that is newer than that list is ignored with",
        "one line `warning: <key>: not known to this version of nemo-jetrl: ignored`; these sections are (with any",
        "top-level section newer than the list):",
        "",
        ", ".join(f"`{key}`" for key in nemo_rl_only()) + ".",
    ]
    for kind, title in SECTIONS.items():
        rows = [(k, r) for k, r in KEY_RULES.items() if _section(r) == kind]
        lines += ["", f"### {title}", "", "| key | meaning here |", "|---|---|"]
        lines += [f"| `{key}` | {rule.docs.replace('|', '/')} |" for key, rule in rows]
    return "\n".join(lines + ["", KEYS_END])


class Outcome(NamedTuple):
    path: str
    family: str  # dense | Qwen3-MoE | MoE | VLM
    ok: bool
    text: str  # the precision line (+ start-up line count) or the error
    ep1: str | None = None  # Qwen3-MoE refused: the outcome with every expert-parallel size set to 1


def family(path: Path, tree: dict) -> str:
    policy = tree.get("policy") or {}
    model = str(policy.get("model_name") or "")
    if policy.get("is_vlm") or (policy.get("tokenizer") or {}).get("use_processor"):
        return "VLM"
    if QWEN3_MOE.search(model) or QWEN3_MOE.search(path.name):
        return "Qwen3-MoE"
    return "MoE" if MOE.search(model) or MOE.search(path.name) else "dense"


def validate_tree(snapshot: Path) -> list[Outcome]:
    """Every GRPO / DAPO config of the snapshot, validated from its root."""
    sys.path.insert(0, str(REPO))
    from nemo_jetrl.config import ConfigError, load_config
    from nemo_jetrl.config.loader import load_yaml_with_defaults
    from nemo_jetrl.precision.config import precision_line
    from nemo_jetrl.schema import validate_config

    configs = snapshot / "examples" / "configs"
    files = sorted(p for p in configs.rglob("*.yaml") if re.match(r"(grpo|dapo)", p.name))
    here, out = Path.cwd(), []
    os.chdir(snapshot)
    try:
        def outcome(rel: Path, overrides: list[str]) -> tuple[bool, str]:
            try:
                cfg = validate_config(load_config(rel, overrides))
            except ConfigError as exc:
                return False, str(exc)
            lines = len(cfg.startup_notes)
            return True, precision_line(cfg.policy) + (f" ({lines} start-up line{'s' * (lines > 1)})" if lines else "")

        for path in files:
            rel = path.relative_to(snapshot)
            tree = load_yaml_with_defaults(rel)
            kind = family(path, tree)
            ok, text = outcome(rel, [])
            ep1 = None
            if not ok and kind == "Qwen3-MoE":
                ep = [f"{k}=1" for k in EP_KEYS if _get(tree, k) not in (None, 1)]
                ep1 = ("validates: " if (r := outcome(rel, ep))[0] else "refused: ") + r[1] if ep else None
            out.append(Outcome(str(rel), kind, ok, text, ep1))
    finally:
        os.chdir(here)
    return out


def _get(tree: dict, key: str):
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def render_tree_table(outcomes: list[Outcome], commit: str) -> str:
    dense = [o for o in outcomes if o.family == "dense"]
    ok_dense, ok_all = sum(o.ok for o in dense), sum(o.ok for o in outcomes)
    qwen_moe = [o for o in outcomes if o.family == "Qwen3-MoE"]
    ok_moe = sum(o.ok or (o.ep1 or "").startswith("validates") for o in qwen_moe)
    lines = [
        TREE_BEGIN,
        "",
        f"NVIDIA-NeMo/RL at {commit}: every `examples/configs/**/{{grpo,dapo}}*.yaml`, run as written from the",
        "snapshot's root with `run_grpo.py --config <file> --validate-only` (environment variables unset). Dense",
        f"(non-MoE, non-VLM) configs: **{ok_dense} of {len(dense)} validate ({100 * ok_dense / len(dense):.1f}%)**; "
        f"all configs: {ok_all} of {len(outcomes)}. Qwen3-MoE configs (docs/moe.md): {ok_moe} of {len(qwen_moe)} "
        "validate as written or with their expert-parallel sizes set to 1 (expert parallelism is not built yet: "
        "refused with the reason); other MoE families are not built.",
        "",
        "| config | model | outcome |",
        "|---|---|---|",
    ]
    for o in outcomes:
        name = o.path.removeprefix("examples/configs/")
        text = o.text.removeprefix("precision: ") if o.ok else _short(o.text)
        if o.ep1 is not None:
            text += "; with expert parallelism 1: " + _short(o.ep1.replace("precision: ", ""), 120)
        lines.append(f"| `{name}` | {o.family} | {'validates: ' if o.ok else 'refused: '}{text.replace('|', '/')} |")
    return "\n".join(lines + ["", TREE_END])


def _short(error: str, limit: int = 160) -> str:
    error = re.sub(r"^\d+ config errors: ", "", error)
    return error if len(error) <= limit else error[: limit - 3] + "..."


def replace_section(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"{DOCS}: markers {begin!r} / {end!r} not found")
    head, rest = text.split(begin, 1)
    return head + body + rest.split(end, 1)[1]


def verify(snapshot: Path, outcomes: list[Outcome], count: int) -> list[str]:
    """Run `count` files through the real command; the mismatches."""
    picks = outcomes[:: max(1, len(outcomes) // count)][:count]
    problems = []
    for o in picks:
        cmd = ["uv", "run", "--project", str(REPO), str(REPO / "examples" / "run_grpo.py"), "--config", o.path]
        run = subprocess.run(cmd + ["--validate-only"], cwd=snapshot, capture_output=True, text=True)
        expected = o.text.split(" (")[0] if o.ok else f"error: {o.text}"
        seen = run.stdout if o.ok else run.stderr
        if (run.returncode == 0) != o.ok or expected not in seen or "Traceback" in run.stderr:
            problems.append(f"{o.path}: rc {run.returncode}, expected {expected[:80]!r}")
        print(f"verified {o.path}: rc {run.returncode}", file=sys.stderr)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("keys", help="rewrite the key table")
    tree = sub.add_parser("tree", help="rewrite the compatibility table of a NeMo-RL snapshot")
    tree.add_argument("snapshot", type=Path)
    tree.add_argument("--commit", required=True, help="the snapshot's commit (named in the docs)")
    tree.add_argument("--verify", type=int, default=0, metavar="N", help="also run N files through the real command")
    args = parser.parse_args(argv)
    text = DOCS.read_text()
    if args.command == "keys":
        DOCS.write_text(replace_section(text, KEYS_BEGIN, KEYS_END, render_key_table()))
        return 0
    outcomes = validate_tree(args.snapshot.resolve())
    DOCS.write_text(replace_section(text, TREE_BEGIN, TREE_END, render_tree_table(outcomes, args.commit)))
    problems = verify(args.snapshot.resolve(), outcomes, args.verify) if args.verify else []
    for problem in problems:
        print(f"mismatch: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
