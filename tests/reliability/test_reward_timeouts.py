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
