"""`RewardJob` (reward_model.launch_reward_fn_async): the reward runs in a background thread while the caller
goes on, on a snapshot of the batch; the result and any error come back at `result()`; sync mode runs inline."""

import threading

import pytest
import torch

from rlpost.protocol import DataProto
from rlpost.trainer.ppo.reward_job import RewardJob

pytestmark = pytest.mark.timeout(30)


def _batch() -> DataProto:
    return DataProto.from_dict(tensors={"responses": torch.ones(3, 2)}, non_tensors={"data_source": ["a", "b", "c"]})


def test_async_job_overlaps_the_caller_and_reads_a_snapshot():
    released = threading.Event()
    seen = {}

    def reward_fn(data, return_dict):
        seen["thread"] = threading.current_thread().name
        seen["keys"] = sorted(data.batch.keys())
        seen["released"] = released.wait(timeout=10)  # blocks until the caller, still running, releases it
        return {"reward_tensor": data.batch["responses"] * 2, "reward_extra_info": {"acc": [1, 0, 1]}}

    batch = _batch()
    job = RewardJob(reward_fn, batch, run_async=True)
    assert job.pending  # the caller got control back before the reward finished
    batch.batch["old_log_probs"] = torch.zeros(3, 2)  # the trainer adds keys meanwhile
    released.set()
    result = job.result()
    assert seen["released"] and seen["thread"].startswith("reward") and seen["keys"] == ["responses"]
    assert torch.equal(result["reward_tensor"], torch.full((3, 2), 2.0)) and not job.pending
    assert job.result() is result


def test_sync_job_runs_inline_and_errors_surface_at_result():
    names = []
    job = RewardJob(lambda data, return_dict: names.append(threading.current_thread().name) or {"x": 1},
                    _batch(), run_async=False)
    assert names == [threading.current_thread().name] and not job.pending and job.result() == {"x": 1}

    def broken(data, return_dict):
        raise ValueError("bad reward")

    failing = RewardJob(broken, _batch(), run_async=True)
    with pytest.raises(ValueError, match="bad reward"):
        failing.result()
