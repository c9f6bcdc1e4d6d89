"""`prime` reward manager: score samples in parallel worker processes, with a timeout per sample.

For reward functions that are slow or may hang (code execution, symbolic math). The function is
rebuilt in each child from its `RewardFnSpec` (path + name), so functions loaded from a user file work
with any start method. A sample that times out scores 0.0 and is flagged in `reward_extra_info`
(`reward_timeout`: 1); an exception in the function is a `RewardFunctionError`, as in `naive`.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import traceback
from typing import Any

from rlpost import keys
from rlpost.reward import base
from rlpost.reward.custom import RewardFnSpec
from rlpost.reward.managers import REWARD_MANAGERS, NaiveRewardManager


def _score_in_child(spec: RewardFnSpec, sample: base.Sample) -> tuple[Any, str | None]:
    # Exceptions come back as text: arbitrary exception objects may not unpickle in the parent.
    try:
        return base.call_reward_fn(spec.resolve(), sample), None
    except base.RewardFunctionError as exc:
        return None, f"{exc.reason}\n{exc.traceback_str}"
    except Exception as exc:  # noqa: BLE001 - resolve() itself failed
        return None, f"{exc!r}\n{traceback.format_exc()}"


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(NaiveRewardManager):
    """Parallel scoring in a `ProcessPoolExecutor` of `num_processes` workers (default: CPU count, at
    most 64) and `timeout` seconds per sample."""

    def __init__(self, tokenizer: Any, num_examine: int, spec: RewardFnSpec,
                 reward_fn_key: str = keys.DATA_SOURCE, num_processes: int | None = None,
                 timeout: float = 300.0):
        super().__init__(tokenizer, num_examine, spec, reward_fn_key)
        self.num_processes = num_processes or min(os.cpu_count() or 1, 64)
        self.timeout = float(timeout)

    def score_samples(self, samples: list[base.Sample]) -> list[Any]:
        results: list[Any] = []
        pool = cf.ProcessPoolExecutor(max_workers=min(self.num_processes, max(len(samples), 1)))
        timed_out = False
        try:
            futures = [pool.submit(_score_in_child, self.spec, s) for s in samples]
            for sample, future in zip(samples, futures):
                try:
                    result, error = future.result(timeout=self.timeout)
                except cf.TimeoutError:
                    timed_out = True
                    results.append({"score": 0.0, "reward_timeout": 1})
                    continue
                if error is not None:
                    raise base.RewardFunctionError(sample.data_source, sample.index, "raised in worker", error)
                score, extra = base.split_result(result, sample)
                results.append({"score": score, **extra, "reward_timeout": 0})
        finally:
            if timed_out:
                # A hung child would block shutdown forever; the executor keeps no public handle to it.
                for proc in list(getattr(pool, "_processes", {}).values()):
                    proc.terminate()
            pool.shutdown(wait=not timed_out, cancel_futures=True)
        return results
