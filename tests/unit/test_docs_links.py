"""Links between the docs resolve: every relative `[text](path#anchor)` in README.md and docs/*.md names a file that
exists and, for a markdown file, a heading it has (GitHub's anchors: lower case, punctuation dropped, spaces to
hyphens, `-1`, `-2` for repeats). Figures are stated once and linked elsewhere, so a dead link loses a figure."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of `markdown` (code blocks skipped)."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def dead_links(path: Path) -> list[str]:
    dead = []
    for target in LINK.findall(path.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            dead.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            dead.append(f"{path.name}: {target} (no such heading)")
    return dead


def test_every_doc_link_resolves():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(docs) > 10
    assert [d for doc in docs for d in dead_links(doc)] == []


def test_anchors_follow_github(tmp_path):
    page = tmp_path / "a.md"
    page.write_text(
        "# Rollout (`bench_rollout.py`)\n## FP8 memory: W^T, 2026\n## Notes\n## Notes\n[x](#notes-1) [y](b.md)"
    )
    assert anchors(page.read_text()) == {"rollout-bench_rolloutpy", "fp8-memory-wt-2026", "notes", "notes-1"}
    assert dead_links(page) == ["a.md: b.md (no such file)"]
