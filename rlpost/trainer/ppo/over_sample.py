"""The trainer's side of `rollout.over_sample_rate`: keep `data.train_batch_size` whole groups of an over-sampled
generation batch, drop the rest, and say how much was cut (`rlpost.rollout.over_sample` does the aborting)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.dynamic_sampling import first_groups


def keep_finished_groups(batch: DataProto, want: int, metrics: dict[str, Any]) -> DataProto:
    """The first `want` groups (in batch order) whose responses all finished; the per-row cut flags are removed.

    Reads non-tensor `uid`, `over_sample_cut`, `over_sample_aborted` (B,). Writes the metrics
    `rollout/over_sample/{generated_groups,kept_groups,cut_groups,cut_frac,aborted_requests,dropped_finished}`:
    groups generated, trained on and cut; the share cut; requests aborted while running; finished responses
    dropped with their group.

    Raises:
        RuntimeError: fewer than `want` groups finished (the rollout did not over-sample as configured).
    """
    cut = np.asarray(batch.non_tensor_batch.pop(K.OVER_SAMPLE_CUT), dtype=bool)
    aborted = np.asarray(batch.non_tensor_batch.pop(K.OVER_SAMPLE_ABORTED), dtype=bool)
    uids = batch.non_tensor_batch[K.UID]
    generated, finished = len(set(uids)), len(set(uids[~cut]))
    if finished < want:
        raise RuntimeError(f"rollout.over_sample_rate: {finished} of {generated} groups finished, fewer than "
                           f"data.train_batch_size={want}")
    batch = first_groups(batch.select_idxs(np.flatnonzero(~cut)), want)
    dropped = len(uids) - len(batch)
    metrics.update({
        "rollout/over_sample/generated_groups": generated,
        "rollout/over_sample/kept_groups": want,
        "rollout/over_sample/cut_groups": generated - want,
        "rollout/over_sample/cut_frac": (generated - want) / generated,
        "rollout/over_sample/aborted_requests": int(aborted.sum()),
        "rollout/over_sample/dropped_finished": dropped - int(aborted.sum()),
    })
    return batch
