"""CoDaPO's cycle in the trainer: the focused batch built from an original step, the order of the batches the
training loop draws, and the pending batch kept by a checkpoint (the end-to-end run is in test_ppo_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.features.codapo import CODAPO_FILE, CodapoCycle, CodapoFeature
from rlpost.trainer.ppo.ray_trainer import RayPPOTrainer

pytestmark = pytest.mark.timeout(60)


class _CountingLoader:
    """A data loader that counts the batches it handed out (as `ResumableLoader` records them done)."""

    def __init__(self, batches: list[dict]) -> None:
        self.batches, self.handed_out = batches, 0

    def __iter__(self):
        for batch in self.batches:
            self.handed_out += 1
            yield batch


def _trainer(loader) -> SimpleNamespace:
    """What `RayPPOTrainer._train_batches` reads of a trainer, with CoDaPO's step feature (top 2 questions)."""
    algo = SimpleNamespace(codapo_top_k=2, codapo_weight_offset=None, codapo_accuracy_key=None)
    trainer = SimpleNamespace(checkpointer=SimpleNamespace(start_epoch=0), epoch=0, train_dataloader=loader,
                              config=SimpleNamespace(trainer=SimpleNamespace(total_epochs=1), algorithm=algo))
    trainer.features = [CodapoFeature(trainer)]
    trainer._loader_batches = lambda: RayPPOTrainer._loader_batches(trainer)
    return trainer


def _original_step(cycle: CodapoCycle) -> dict:
    """Three questions q0-q2, two responses each; q1 half right (the most valuable), q0 all right, q2 all wrong."""
    prompts = DataProto.from_dict(tensors={K.INPUT_IDS: torch.arange(6).reshape(3, 2)},
                                  non_tensors={K.UID: np.array(["q0", "q1", "q2"], dtype=object),
                                               "data_source": np.array(["s0", "s1", "s2"], dtype=object)})
    cycle.remember(prompts)
    rows = prompts.repeat(2, interleave=True)
    rows.batch[K.RESPONSE_MASK] = torch.ones(6, 2)
    rows.non_tensor_batch["acc"] = np.array([1, 1, 1, 0, 0, 0], dtype=object)
    rows.batch[K.OLD_LOG_PROBS] = torch.full((6, 2), -0.1)
    return cycle.observe(rows)


def test_the_focused_batch_repeats_the_best_questions_without_their_uids():
    cycle = CodapoCycle(SimpleNamespace(codapo_top_k=1, codapo_weight_offset=None, codapo_accuracy_key=None))
    metrics = _original_step(cycle)
    assert metrics["codapo/is_focused_step"] == 0.0
    assert metrics["codapo/selected_value/mean"] == pytest.approx(float(np.exp(-0.1)))  # d = 0.5: v = c
    assert metrics["codapo/value/mean"] == pytest.approx(float(np.exp(-0.1)) / 3)
    focus = cycle.take()
    assert K.UID not in focus and list(focus["data_source"]) == ["s1"] * 3  # round-robin to the batch size
    assert focus[K.INPUT_IDS].tolist() == [[2, 3]] * 3
    assert cycle.pending is None
    assert cycle.observe(DataProto.from_dict(tensors={K.RESPONSE_MASK: torch.ones(1, 1)})) == \
        {"codapo/is_focused_step": 1.0}  # the focused step chooses nothing


def test_the_loop_trains_each_batchs_focused_step_next_and_a_checkpoint_keeps_it(tmp_path):
    trainer = _trainer([{"name": "batch0"}, {"name": "batch1"}])
    cycle = trainer.features[0].cycle
    drawn = RayPPOTrainer._train_batches(trainer)
    assert next(drawn) == {"name": "batch0"}
    _original_step(cycle)  # the step of batch0 ran
    focus = next(drawn)
    assert list(focus["data_source"]) == ["s1", "s0", "s1"]  # the two best, round-robin
    cycle.observe(None)  # the focused step ran
    assert next(drawn) == {"name": "batch1"}
    # a checkpoint between the phases keeps the focused batch; a resumed run draws it before the next batch
    _original_step(cycle)
    trainer.features[0].save(str(tmp_path))
    resumed = _trainer(_CountingLoader([{"name": "batch2"}]))
    resumed.features[0].load(str(tmp_path))
    drawn = RayPPOTrainer._train_batches(resumed)
    assert list(next(drawn)["data_source"]) == ["s1", "s0", "s1"]
    # the loader has handed out nothing while the focused step trains: a checkpoint now records no batch as done
    assert resumed.train_dataloader.handed_out == 0
    assert next(drawn) == {"name": "batch2"} and resumed.train_dataloader.handed_out == 1
    (tmp_path / CODAPO_FILE).unlink()
    empty = CodapoCycle(SimpleNamespace(codapo_top_k=2, codapo_weight_offset=None, codapo_accuracy_key=None))
    empty.load(str(tmp_path))
    assert empty.pending is None
