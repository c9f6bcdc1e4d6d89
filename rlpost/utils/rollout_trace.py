"""verl's rollout-tracing decorators for agent loops, as they behave with tracing off.

`actor_rollout_ref.rollout.trace.backend` (weave, mlflow) is not supported yet and is refused at start-up,
so every trace here is off: `@rollout_trace_op` returns the function unchanged and `rollout_trace_attr`
records nothing. A loop decorated for verl's tracing runs as it does there without a backend.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

__all__ = ["rollout_trace_attr", "rollout_trace_op"]


def rollout_trace_op(func: Callable) -> Callable:
    """Mark a method as a traced step (no backend: the method itself)."""
    return func


@contextlib.contextmanager
def rollout_trace_attr(sample_index: Any = None, step: Any = None, rollout_n: Any = None, name: str = "rollout_trace",
                       validate: bool = False, trace: bool = True, **kwargs: Any) -> Iterator[None]:
    """Attributes of the traces started inside the block (no backend: nothing is recorded)."""
    yield
