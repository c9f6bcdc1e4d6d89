"""Boxed-answer math scorer (MATH-style data): compare the last `\\boxed{...}` after normalisation.

Normalisation removes what differs in notation but not in value: spaces, `\\left`/`\\right`, `$`,
`\\!`, `dfrac`/`tfrac`, degree marks, `\\text{...}` wrappers, a leading `x =`, a trailing period,
and rewrites `\\frac12` as `\\frac{1}{2}`, `a/b` (integers) as `\\frac{a}{b}` and `.5` as `0.5`.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_content(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` / `\\boxed x` in `text`, braces balanced."""
    start, cmd = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start + len(cmd) :]
    if rest.startswith(" "):
        # `\boxed 5`: the argument is the next token
        return rest.strip().split("$")[0].split()[0] if rest.strip() else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return rest[1:i]
    return None


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}, \frac{1}2 -> \frac{1}{2}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    return re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)


def normalize_answer(answer: str) -> str:
    """Canonical string form of a math answer (see module docstring)."""
    s = answer.strip().replace("\n", "")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("$", ""), ("dfrac", "frac"),
                     ("tfrac", "frac"), ("^{\\circ}", ""), ("^\\circ", ""), ("\\%", ""), ("%", "")):
        s = s.replace(old, new)
    s = s.replace(" ", "").rstrip(".")
    s = re.sub(r"^[a-zA-Z]\s*=", "", s)
    s = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", s)
    s = _fix_fracs(s)
    if re.fullmatch(r"-?\d+/\d+", s):
        num, den = s.split("/")
        s = f"\\frac{{{num}}}{{{den}}}"
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer of `solution_str` normalises to the ground truth, else 0.0.

    `ground_truth` may itself contain a `\\boxed{}`; then its content is the reference.
    """
    predicted = last_boxed_content(solution_str)
    if predicted is None:
        return 0.0
    reference = last_boxed_content(ground_truth) or ground_truth
    return 1.0 if normalize_answer(predicted) == normalize_answer(reference) else 0.0
