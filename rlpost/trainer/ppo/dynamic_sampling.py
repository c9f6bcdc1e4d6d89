"""Helpers of DAPO's dynamic sampling (`algorithm.filter_groups`): the next batch of prompts to generate, and
the first whole groups of a batch that has more than the step needs."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from rlpost import keys as K
from rlpost.protocol import DataProto


class DataExhausted(Exception):
    """Dynamic sampling needed another batch of prompts after the last epoch's last one."""


def next_batch(more_batches: Iterator[dict | DataProto] | None) -> DataProto:
    if more_batches is None:
        raise ValueError("algorithm.filter_groups needs more batches of prompts: pass train_step(batch, more_batches)")
    try:
        item = next(more_batches)
    except StopIteration:
        raise DataExhausted("dynamic sampling (algorithm.filter_groups) ran out of prompts in the last epoch") from None
    return item if isinstance(item, DataProto) else DataProto.from_single_dict(item)


def first_groups(batch: DataProto, n_groups: int) -> DataProto:
    """The rows of the first `n_groups` distinct uids of `batch`, in batch order."""
    uids = batch.non_tensor_batch[K.UID]
    keep = set(list(dict.fromkeys(uids.tolist()))[:n_groups])  # dict keeps first-seen order
    return batch.select_idxs(np.flatnonzero([u in keep for u in uids]))
