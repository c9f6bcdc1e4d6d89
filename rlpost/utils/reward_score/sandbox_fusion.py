"""verl import-path alias of the sandbox code scorer (`rlpost.reward.score.code`), with verl's call shape."""

from __future__ import annotations

from typing import Any

from rlpost.reward.score import code


def compute_score(sandbox_fusion_url: str, concurrent_semaphore: Any, memory_limit_mb: int, completion: str,
                  test_cases: Any, continuous: bool = False, timeout: float = 10) -> tuple[float, list[dict]]:
    """(score, [details]) as verl's `sandbox_fusion.compute_score` returns them."""
    result = code.compute_score(sandbox_fusion_url, completion, test_cases, continuous=continuous, timeout=timeout,
                                memory_limit_mb=memory_limit_mb, concurrent_semaphore=concurrent_semaphore)
    return result["score"], [{k: v for k, v in result.items() if k != "score"}]


__all__ = ["compute_score"]
