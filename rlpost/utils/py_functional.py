"""verl's small Python helpers used by recipes: dict merging, a time limit on a call, a temporary env variable."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import pickle
import queue
import signal
from typing import Any, Callable, Iterator

__all__ = ["append_to_dict", "rename_dict", "temp_env_var", "timeout_limit", "union_two_dict"]


def append_to_dict(data: dict[str, list], new_data: dict[str, Any], prefix: str = "") -> None:
    """Append each value of `new_data` to the list under `prefix + key` in `data` (a new key starts a list)."""
    for key, value in new_data.items():
        data.setdefault(prefix + key, []).append(value)


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """dict1 updated with dict2 in place (and returned); a key in both must hold the same value."""
    for key, value in dict2.items():
        if key in dict1 and dict1[key] != value:
            raise ValueError(f"union_two_dict: key {key!r} is {dict1[key]!r} in one dict and {value!r} in the other")
        dict1[key] = value
    return dict1


def rename_dict(data: dict, prefix: str = "") -> dict:
    """A copy of `data` with `prefix` put before every key."""
    return {prefix + key: value for key, value in data.items()}


@contextlib.contextmanager
def temp_env_var(key: str, value: str) -> Iterator[None]:
    """Set environment variable `key` to `value` inside the block; restore (or remove) it afterwards, also on error."""
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def _run_in_child(func: Callable, results: Any, args: tuple, kwargs: dict) -> None:
    try:
        results.put((True, func(*args, **kwargs)))
    except Exception as err:  # noqa: BLE001  (handed to the parent, which re-raises it)
        try:
            pickle.dumps(err)
        except Exception:  # noqa: BLE001  (an exception that cannot travel back is described instead)
            err = RuntimeError(f"{type(err).__name__} (not picklable): {err}")
        results.put((False, err))


def timeout_limit(seconds: float, use_signals: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: the call raises TimeoutError after `seconds`.

    By default the function runs in a child process, which is killed at the limit (works from any thread; the
    arguments and the result must be picklable, and the child's side effects stay in the child).
    `use_signals=True` runs it in this process under SIGALRM instead (main thread of a POSIX process only).
    An exception the function raises is raised again in the caller.
    """
    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def with_signal(*args: Any, **kwargs: Any) -> Any:
            if os.name != "posix":
                raise NotImplementedError(f"timeout_limit(use_signals=True) needs POSIX signals, not {os.name}")

            def expire(signum: int, frame: Any) -> None:
                raise TimeoutError(f"{func.__name__} timed out after {seconds} s (signal)")

            previous = signal.signal(signal.SIGALRM, expire)
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                return func(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

        @functools.wraps(func)
        def in_child(*args: Any, **kwargs: Any) -> Any:
            results: Any = multiprocessing.Queue(maxsize=1)
            child = multiprocessing.Process(target=_run_in_child, args=(func, results, args, kwargs))
            child.start()
            try:
                try:
                    ok, value = results.get(timeout=seconds)
                except queue.Empty:
                    raise TimeoutError(f"{func.__name__} timed out after {seconds} s "
                                       f"(child process exit code {child.exitcode})") from None
            finally:
                if child.is_alive():
                    child.terminate()
                child.join(timeout=5)
                results.close()
            if not ok:
                raise value
            return value

        return with_signal if use_signals else in_child

    return decorator
