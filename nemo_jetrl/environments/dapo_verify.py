"""DAPO's answer check (`env.math.math_verify_impl: dapo_math_verify`, NeMo-RL's `dapo_math_verify`).

A response is correct when the last `Answer: <text>` line (case-insensitive) within its final 300 characters,
normalised, equals the normalised reference. Normalisation is Minerva's (Lewkowycz et al. 2022, appendix D): keep
what follows the last `=`, drop units, articles, spaces and `\\text{...}` wrappers, unwrap `$...$`, `\\boxed{...}`,
`\\textbf{...}` and `\\overline{...}`, expand `\\fracab` / `\\sqrta` shorthand, drop thousands separators of plain
integers. No math equivalence: `0.5` and `1/2` differ (math-verify's `hf_math_verify` is the symbolic check).
"""

from __future__ import annotations

import re

TAIL_CHARS = 300  # DAPO looks at the end of the response only
ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
NO_ANSWER = "[INVALID]"

# (text, replacement), applied in this order
_REPLACEMENTS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
# units and filler words removed everywhere, in this order
_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_UNWRAP = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),
)


def normalize_answer(text: str) -> str:
    """Minerva's normalisation of a final answer (see the module docstring)."""
    text = text.split("=")[-1]
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    for word in _REMOVED:
        text = text.replace(word, "")
    for pattern, repl in _UNWRAP:
        text = pattern.sub(repl, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def dapo_check(response: str, reference: str) -> tuple[bool, str]:
    """(correct, the normalised prediction; `[INVALID]` without an `Answer:` line)."""
    found = ANSWER_LINE.findall(response[-TAIL_CHARS:])
    pred = normalize_answer(found[-1] if found else NO_ANSWER)
    return pred == normalize_answer(reference), pred
