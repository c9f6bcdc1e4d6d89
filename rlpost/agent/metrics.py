"""Per-trajectory counters of the agent loops, and their per-step summary (`multi_turn/*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from rlpost.agent.base import AgentLoopOutput


TIMINGS = ("generate_s", "tool_calls_s")  # seconds per trajectory, from loops written against verl


@dataclass
class TrajectoryStats:
    """Counters of one trajectory.

    Attributes:
        assistant_turns: model turns.
        user_turns: turns answering the model (a round of tool results, or an interaction's reply).
        tool_calls: calls run (failed ones included; bad and dropped ones not).
        tool_errors: calls that raised, timed out or named an unknown tool.
        bad_tool_calls: tool-call blocks that could not be decoded (kept as text).
        interaction_turns: replies the interaction gave (the final, terminating one included).
        truncated: the response budget cut a turn or stopped the conversation.
        tokenization_mismatch: the tokenization sanity check found a difference.
    """

    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    bad_tool_calls: int = 0
    interaction_turns: int = 0
    truncated: bool = False
    tokenization_mismatch: bool = False

    @property
    def num_turns(self) -> int:
        """verl's count: the prompt, each model turn and each answering turn."""
        return 1 + self.assistant_turns + self.user_turns

    def as_metrics(self) -> dict[str, float]:
        return {
            "assistant_turns": float(self.assistant_turns),
            "tool_calls": float(self.tool_calls),
            "tool_errors": float(self.tool_errors),
            "bad_tool_calls": float(self.bad_tool_calls),
            "interaction_turns": float(self.interaction_turns),
            "truncated": float(self.truncated),
            "tokenization_mismatch": float(self.tokenization_mismatch),
        }


def aggregate_metrics(outputs: Sequence[AgentLoopOutput]) -> dict[str, float]:
    """Step metrics over a batch of trajectories (see `summarize`)."""
    return summarize([o.num_turns for o in outputs], [o.metrics for o in outputs])


def summarize(num_turns: Sequence[float], per_trajectory: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Step metrics from each trajectory's `num_turns` and `metrics` (`TrajectoryStats.as_metrics`).

    Returns:
        `multi_turn/num_turns/{mean,max}`, `multi_turn/tool_calls/mean`, `multi_turn/interaction_turns/mean`
        (per trajectory), `multi_turn/tool_call_frac` (share of trajectories with at least one tool call),
        `multi_turn/tool_errors` and `multi_turn/bad_tool_calls` (totals of the batch),
        `multi_turn/truncated_frac` and `multi_turn/tokenization_mismatch_frac`; {} for no trajectories.
        Loops written against verl report seconds instead of counters: `multi_turn/{generate_s,tool_calls_s}/mean`.
        `external_agent` rows add `multi_turn/program/<outcome>` (rows of each outcome).
    """
    if not len(num_turns):
        return {}
    n = len(num_turns)

    def values(key: str) -> list[float]:
        return [float(m.get(key, 0.0)) for m in per_trajectory]

    turns = [float(t) for t in num_turns]
    timings = {f"multi_turn/{key}/mean": sum(values(key)) / n for key in TIMINGS
               if any(key in m for m in per_trajectory)}
    # external_agent's per-row outcomes (ok, crashed, timeout, ...): rows of each in the batch
    outcomes = sorted({k for m in per_trajectory for k in m if k.startswith("program_")})
    programs = {f"multi_turn/program/{k.removeprefix('program_')}": sum(values(k)) for k in outcomes}
    return {
        **timings,
        **programs,
        "multi_turn/num_turns/mean": sum(turns) / n,
        "multi_turn/num_turns/max": max(turns),
        "multi_turn/tool_calls/mean": sum(values("tool_calls")) / n,
        "multi_turn/tool_call_frac": sum(v > 0 for v in values("tool_calls")) / n,
        "multi_turn/interaction_turns/mean": sum(values("interaction_turns")) / n,
        "multi_turn/tool_errors": sum(values("tool_errors")),
        "multi_turn/bad_tool_calls": sum(values("bad_tool_calls")),
        "multi_turn/truncated_frac": sum(values("truncated")) / n,
        "multi_turn/tokenization_mismatch_frac": sum(values("tokenization_mismatch")) / n,
    }
