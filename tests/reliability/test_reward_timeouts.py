"""The prime reward manager's time-outs: concurrent (two hung samples on two workers cost one time-out,
not two), counted per sample in `reward_timeout` (summed by the trainer into reward/timeout_count), warned
with the sample; a hung sample does not hold its worker, so the samples queued behind it are scored."""

import logging
import time

import pytest

from rlpost.reward.base import Sample
from rlpost.reward.custom import RewardFnSpec
from rlpost.reward.prime import PrimeRewardManager

REWARD = '''
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if ground_truth == "hang":
        while True:  # a busy loop in Python: the child's timer interrupts it
            time.sleep(0.05)
    return 1.0 if solution_str == ground_truth else 0.0
'''


def sample(i: int, response: str, ground_truth: str) -> Sample:
    return Sample(index=i, data_source="my/source", prompt_str="", response_str=response,
                  ground_truth=ground_truth, extra_info={}, valid_response_length=1)


@pytest.mark.timeout(60)
def test_timeouts_are_concurrent_counted_and_warned(tmp_path, caplog):
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    manager = PrimeRewardManager(None, 0, RewardFnSpec(str(path)), num_processes=2, timeout=2.0)
    samples = [sample(0, "3", "hang"), sample(1, "4", "hang"), sample(2, "5", "5"), sample(3, "6", "7")]
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        results = manager.score_samples(samples)
    elapsed = time.monotonic() - start
    assert [r["score"] for r in results] == [0.0, 0.0, 1.0, 0.0]
    assert [r["reward_timeout"] for r in results] == [1, 1, 0, 0]
    assert elapsed < 2.0 * 2, f"two time-outs on two workers took {elapsed:.1f}s: they ran one after another"
    assert "timed out after reward_model.reward_kwargs.timeout=2.0s on data source 'my/source', sample 1" in caplog.text
    assert "response: '4'" in caplog.text and "reward/timeout_count" in caplog.text


NAIVE_REWARD = '''
import os, sys, time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if ground_truth == "hang":
        while True:
            time.sleep(0.05)
    if ground_truth == "exit":
        sys.exit(7)
    if ground_truth == "os_exit":
        os._exit(7)
    return 1.0 if solution_str == ground_truth else 0.0
'''


def _naive(tmp_path, **kwargs):
    from rlpost.reward.managers import NaiveRewardManager

    path = tmp_path / "reward.py"
    path.write_text(NAIVE_REWARD)
    return NaiveRewardManager(None, 0, RewardFnSpec(str(path)), **kwargs)


@pytest.mark.timeout(60)
def test_the_naive_managers_time_out_holds_from_the_first_in_process_sample(tmp_path, caplog):
    # the first sample hangs: in this process (the function is not yet known to be slow), the time-out stops it,
    # scores it 0.0 and moves the rest of the batch to worker processes
    manager = _naive(tmp_path, num_processes=2, timeout=1.0)
    samples = [sample(0, "x", "hang"), sample(1, "5", "5"), sample(2, "6", "7")]
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        results = manager.score_samples(samples)
    assert time.monotonic() - start < 20
    assert [r["score"] for r in results] == [0.0, 1.0, 0.0]
    assert [r["reward_timeout"] for r in results] == [1, 0, 0]
    assert "timed out after reward_model.reward_kwargs.timeout=1.0s on data source 'my/source', sample 0" in caplog.text


@pytest.mark.timeout(60)
def test_exit_in_a_reward_function_names_the_function_sample_and_call(tmp_path):
    from rlpost.reward.base import RewardFunctionError

    manager = _naive(tmp_path, num_processes=2, timeout=5.0)
    with pytest.raises(RewardFunctionError) as err:
        manager.score_samples([sample(0, "5", "5"), sample(1, "x", "exit")])
    assert "sample 1" in str(err.value) and "called exit(7)" in str(err.value) and "my/source" in str(err.value)


@pytest.mark.timeout(60)
def test_os_exit_in_a_worker_process_is_named_not_a_silent_exit(tmp_path):
    from rlpost.reward.base import RewardFunctionError
    from rlpost.reward.parallel import score_in_processes

    spec = RewardFnSpec(str(tmp_path / "reward.py"))
    (tmp_path / "reward.py").write_text(NAIVE_REWARD)
    with pytest.raises(RewardFunctionError) as err:
        score_in_processes(spec, [sample(0, "x", "os_exit"), sample(1, "5", "5")], 1, 5.0)
    assert "ended without a result (the function called os._exit" in str(err.value)
