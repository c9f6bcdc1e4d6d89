"""Tokenization sanity check: the trajectory's token-by-token ids against one re-tokenization of the
whole conversation (`multi_turn.tokenization_sanity_check_mode`).

- `strict`: any difference is a mismatch.
- `ignore_strippable`: differences whose two sides both decode to whitespace only are ignored (templates
  that trim message content, a newline the model put before its answer, ...).
- `disable`: no check.

A mismatch does not stop training: it means the tokens trained on are not what the template would
produce for the same conversation (usually harmless: the model's own tokens are the ones that were
sampled), and it is reported so a template problem shows up early.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Sequence

SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")


@dataclass(frozen=True)
class SanityReport:
    """Outcome of one check.

    Attributes:
        ok: True when no (counted) difference was found, or the check is disabled.
        mode: the mode it ran in.
        diffs: (reference text, trajectory text) of each counted difference, decoded.
    """

    ok: bool
    mode: str
    diffs: list[tuple[str, str]] = field(default_factory=list)

    def describe(self) -> str:
        """One line for a log: how many differences and the first one."""
        if self.ok:
            return f"tokenization check ({self.mode}): ok"
        ref, got = self.diffs[0]
        return (f"tokenization check ({self.mode}): {len(self.diffs)} difference(s) between the turn-by-turn "
                f"tokens and a full re-tokenization; first: full={ref!r} turn-by-turn={got!r}")


def check_tokenization(
    tokenizer: Any, reference_ids: Sequence[int], trajectory_ids: Sequence[int], mode: str
) -> SanityReport:
    """Compare `trajectory_ids` (prompt + response built turn by turn) with `reference_ids` (the whole
    conversation rendered and tokenized at once).

    Args:
        tokenizer: decodes the differing spans for the report.
        reference_ids: (N,) ids of the full re-tokenization.
        trajectory_ids: (M,) ids of the trajectory.
        mode: one of SANITY_CHECK_MODES.

    Raises:
        ValueError: unknown mode.
    """
    if mode not in SANITY_CHECK_MODES:
        raise ValueError(f"tokenization_sanity_check_mode must be one of {list(SANITY_CHECK_MODES)}, got {mode!r}")
    if mode == "disable" or list(reference_ids) == list(trajectory_ids):
        return SanityReport(ok=True, mode=mode)
    matcher = difflib.SequenceMatcher(None, list(reference_ids), list(trajectory_ids), autojunk=False)
    diffs = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        ref = tokenizer.decode(list(reference_ids[i1:i2]), skip_special_tokens=False)
        got = tokenizer.decode(list(trajectory_ids[j1:j2]), skip_special_tokens=False)
        if mode == "ignore_strippable" and not ref.strip() and not got.strip():
            continue
        diffs.append((ref, got))
    return SanityReport(ok=not diffs, mode=mode, diffs=diffs)
