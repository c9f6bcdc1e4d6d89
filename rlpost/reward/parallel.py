"""Score reward samples in worker processes with a time-out per sample (used by `prime`, and by `naive`
once it finds the reward function slow).

The function is rebuilt in each child from its `RewardFnSpec` (path + name), so functions loaded from a
user file work with any start method. Each child stops its own sample after `timeout` seconds (an
interval timer), so time-outs run concurrently and a hung sample does not hold its worker; a pool-wide
deadline covers code the timer cannot interrupt. A sample that times out scores 0.0, is flagged in
`reward_extra_info` (`reward_timeout`: 1, summed by the trainer into `reward/timeout_count`) and is
warned about with its data source, index and response; an exception in the function is a
`RewardFunctionError` naming the sample.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import signal
import threading
import traceback
from typing import Any, Callable

from rlpost.reward import base
from rlpost.reward.custom import RewardFnSpec

logger = logging.getLogger(__name__)
TIMED_OUT = "timed out"
TIME_LIMIT_HIT = object()  # what `call_with_time_limit` returns for a call it stopped


class _SampleTimeout(BaseException):
    """Raised in a child by its interval timer; a BaseException so the user's `except Exception` lets it by."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SampleTimeout()


def call_with_time_limit(fn: Any, sample: base.Sample, timeout: float) -> Any:
    """`base.call_reward_fn(fn, sample)` stopped after `timeout` seconds (then `TIME_LIMIT_HIT` is returned) by this
    process's interval timer; only in the main thread (where signals arrive), elsewhere without a limit."""
    if threading.current_thread() is not threading.main_thread():
        return base.call_reward_fn(fn, sample)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return base.call_reward_fn(fn, sample)
    except _SampleTimeout:
        return TIME_LIMIT_HIT
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _score_in_child(spec: RewardFnSpec, sample: base.Sample, timeout: float) -> tuple[Any, str | None]:
    # Exceptions come back as text: arbitrary exception objects may not unpickle in the parent.
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return base.call_reward_fn(spec.resolve(), sample), None
    except _SampleTimeout:
        return None, TIMED_OUT
    except base.RewardFunctionError as exc:
        return None, f"{exc.reason}\n{exc.traceback_str}"
    except Exception as exc:  # noqa: BLE001 - resolve() itself failed
        return None, f"{exc!r}\n{traceback.format_exc()}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def score_in_processes(spec: RewardFnSpec, samples: list[base.Sample], num_processes: int,
                       timeout: float, normalise: Callable[[Any], Any] | None = None) -> list[dict[str, Any]]:
    """One result dict per sample (`score`, the function's extra keys, `reward_timeout` 0/1).

    Args:
        spec: rebuilds the reward function in each child.
        samples: the decoded samples.
        num_processes: pool size (capped at the number of samples).
        timeout: seconds per sample; `reward_model.reward_kwargs.timeout` in messages.
        normalise: applied to each raw result (and to a time-out's 0.0) before it is split into score and extras
            (the dapo manager's plain number -> {score, acc}).
    """
    workers = min(num_processes, max(len(samples), 1))
    pool = cf.ProcessPoolExecutor(max_workers=workers)
    # Backstop for code the child's timer cannot interrupt (a long C call): every worker runs at most
    # ceil(n / workers) samples of `timeout` seconds each.
    deadline = timeout * math.ceil(len(samples) / workers) + 5.0
    futures = [pool.submit(_score_in_child, spec, s, timeout) for s in samples]
    done, stuck = cf.wait(futures, timeout=deadline)
    try:
        return [_result(sample, future if future in done else None, timeout, normalise or (lambda r: r))
                for sample, future in zip(samples, futures)]
    finally:
        if stuck:  # a hung child would block shutdown forever; the executor keeps no public handle to it
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        pool.shutdown(wait=not stuck, cancel_futures=True)


def _result(sample: base.Sample, future: cf.Future | None, timeout: float,
            normalise: Callable[[Any], Any]) -> dict[str, Any]:
    """The sample's result dict; a time-out (`future` None: past the deadline) scores 0.0, warned."""
    try:
        result, error = future.result() if future is not None else (None, TIMED_OUT)
    except cf.process.BrokenProcessPool:
        raise base.RewardFunctionError(
            sample.data_source, sample.index, "a worker process scoring this batch ended without a result (the "
            "function called os._exit, was killed by a signal, or crashed the interpreter); this is the first "
            "sample left unscored") from None
    if error == TIMED_OUT:
        logger.warning(
            "reward function timed out after reward_model.reward_kwargs.timeout=%ss on data source %r, "
            "sample %d (scored 0.0, counted in reward/timeout_count); response: %r",
            timeout, sample.data_source, sample.index, sample.response_str[:200])
        score, extra = base.split_result(normalise(0.0), sample)
        return {"score": score, **extra, "reward_timeout": 1}
    if error is not None:
        raise base.RewardFunctionError(sample.data_source, sample.index, "raised in worker", error)
    score, extra = base.split_result(normalise(result), sample)
    return {"score": score, **extra, "reward_timeout": 0}
