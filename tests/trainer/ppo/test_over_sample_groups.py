"""The trainer keeps `data.train_batch_size` finished groups of an over-sampled generation batch and counts the
cut (values derived by hand)."""

import numpy as np
import pytest
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.over_sample import keep_finished_groups

pytestmark = pytest.mark.timeout(60)


def batch(cut, aborted):
    uids = np.array(list("aabbccdd"), dtype=object)
    return DataProto.from_dict(tensors={K.RESPONSES: torch.arange(8).unsqueeze(-1)},
                               non_tensors={K.UID: uids, K.OVER_SAMPLE_CUT: np.array(cut),
                                            K.OVER_SAMPLE_ABORTED: np.array(aborted)})


def test_first_finished_groups_in_batch_order_are_kept_and_the_cut_is_counted():
    # b cut (b0 aborted, b1 had finished); a, c, d finished: the first two in batch order, a and c, are kept
    metrics = {}
    out = keep_finished_groups(batch([0, 0, 1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0]), 2, metrics)
    assert out.batch[K.RESPONSES].squeeze(-1).tolist() == [0, 1, 4, 5]
    assert list(out.non_tensor_batch[K.UID]) == list("aacc")
    assert K.OVER_SAMPLE_CUT not in out.non_tensor_batch and K.OVER_SAMPLE_ABORTED not in out.non_tensor_batch
    assert metrics == {"rollout/over_sample/generated_groups": 4, "rollout/over_sample/kept_groups": 2,
                       "rollout/over_sample/cut_groups": 2, "rollout/over_sample/cut_frac": 0.5,
                       "rollout/over_sample/aborted_requests": 1,
                       "rollout/over_sample/dropped_finished": 3}  # b1, and d's two rows beyond the batch


def test_too_few_finished_groups_is_an_error():
    with pytest.raises(RuntimeError, match="1 of 4 groups finished, fewer than data.train_batch_size=2"):
        keep_finished_groups(batch([0, 0, 1, 1, 1, 1, 1, 1], [0] * 8), 2, {})
