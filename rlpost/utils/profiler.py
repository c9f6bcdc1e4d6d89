"""verl's step timers: `marked_timer` / `simple_timer` add a block's wall time to a dict (seconds).

Profilers (nsys, torch) are not built; these only time, which is what trainer code uses them for.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to `timing_raw[name]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def marked_timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any) -> Iterator[None]:
    """verl's marked timer; the colour / domain arguments of its profiler markers change nothing here."""
    with simple_timer(name, timing_raw):
        yield
