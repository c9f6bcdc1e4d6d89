"""The rule reward of one batch as a job (`reward_model.launch_reward_fn_async`): computed at once, or in a
background thread while the trainer waits on the old / reference log-prob and value passes.

A thread is enough: the trainer's main thread spends those passes in `ray.get`, which releases the GIL, so
a Python reward function runs alongside (a `prime` manager scores in its own process pool either way). The
job reads a snapshot of the batch (its own key dicts), so the main thread may add keys meanwhile.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from rlpost.protocol import DataProto

_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """One reward thread per process: jobs of consecutive steps run one after the other."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
    return _POOL


def snapshot(batch: DataProto) -> DataProto:
    """The same rows and tensors in new key dicts (no tensor is copied)."""
    return DataProto(batch=dict(batch.batch), non_tensor_batch=dict(batch.non_tensor_batch),
                     meta_info=dict(batch.meta_info))


class RewardJob:
    """`reward_fn(batch, return_dict=True)` of one batch, started now; `result()` waits for it.

    Args:
        reward_fn: a reward manager (`fn(data, return_dict=True)` -> {"reward_tensor", "reward_extra_info"}).
        batch: the scored rows (a snapshot is taken). run_async: compute in the background thread.
    """

    def __init__(self, reward_fn: Callable[..., dict[str, Any]], batch: DataProto, run_async: bool) -> None:
        data = snapshot(batch)
        if run_async:
            self._future: Future | None = _pool().submit(reward_fn, data, return_dict=True)
            self._value = None
        else:
            self._future, self._value = None, reward_fn(data, return_dict=True)

    @property
    def pending(self) -> bool:
        """True while a background job is still running."""
        return self._future is not None and not self._future.done()

    def result(self) -> dict[str, Any]:
        """The reward manager's result dict; a failure in the background thread is raised here."""
        if self._future is not None:
            self._value, self._future = self._future.result(), None
        return self._value
