"""`SplitRollouts` ordering without Ray: which weights each batch is generated with, what a checkpoint keeps,
and how a resumed driver continues. Stand-in groups record the order of calls, as a Ray actor serves them."""

import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.rollout_driver import PREPARED, SplitRollouts


class Future:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class RolloutGroup:
    """Generates in call order; each output row holds the weight version the engine had (transfers received)."""

    world_size = 1

    def __init__(self, log):
        self.log, self.weights = log, 0

    def generate_sequences(self, gen):
        self.log.append(("gen", gen.meta_info[K.META_GLOBAL_STEP], self.weights))
        out = DataProto.from_dict({K.RESPONSES: torch.full((len(gen), 1), self.weights)})
        return Future(out)

    def receive_weights(self):
        self.weights += 1
        self.log.append(("receive", self.weights))
        return Future([0.0])


class ActorGroup:
    def send_weights(self):
        return Future([{"timing_s/send_weights": 0.1, "perf/weight_sync_bytes": 8.0}])


def _prepare(batch):
    batch.meta_info[PREPARED] = True
    return batch


def _gen_inputs(batch, step=None):
    gen = DataProto.from_dict({K.INPUT_IDS: batch.batch[K.INPUT_IDS]})
    gen.meta_info[K.META_GLOBAL_STEP] = step
    return gen


def _driver(staleness, log):
    return SplitRollouts(ActorGroup(), RolloutGroup(log), staleness, _prepare, _gen_inputs)


def _train(driver, n_batches, first_batch=0, first_step=1):
    """The trainer's loop over the data loader's batches `first_batch`..`n_batches - 1`: take a batch, get its
    rollouts, update, send the weights. Returns (batch index, weight version it was generated with)."""
    dicts = ({K.INPUT_IDS: torch.full((2, 3), i)} for i in range(first_batch, n_batches))
    seen = []
    for step, batch in enumerate(driver.batches(dicts), start=first_step):
        out = driver.generate(batch)
        seen.append((int(batch.batch[K.INPUT_IDS][0, 0]), int(out.batch[K.RESPONSES][0, 0])))
        driver.sync_weights({})
        assert driver.metrics(step)["training/policy_version"] == seen[-1][1]
    return seen


def test_one_step_off_generates_batch_k_plus_1_with_the_weights_of_step_k_minus_1():
    log = []
    seen = _train(_driver(1, log), 4)
    assert seen == [(0, 0), (1, 0), (2, 1), (3, 2)]  # (batch, weight version it was generated with)
    # batch 2 is submitted before batch 1 trains; each later one right after the previous update was sent
    assert [e for e in log if e[0] == "gen"] == [("gen", 1, 0), ("gen", 2, 0), ("gen", 3, 1), ("gen", 4, 2)]


def test_on_policy_split_generates_each_batch_after_the_last_update():
    seen = _train(_driver(0, []), 3)
    assert seen == [(0, 0), (1, 1), (2, 2)]


def test_checkpoint_keeps_the_batch_generated_ahead_and_resume_continues_it(tmp_path):
    straight = _train(_driver(1, []), 4)
    first = _driver(1, [])
    it = first.batches({K.INPUT_IDS: torch.full((2, 3), i)} for i in range(4))
    for _ in range(2):  # train steps 1 and 2, then checkpoint
        first.generate(next(it))
        first.sync_weights({})
    first.save(str(tmp_path))
    resumed = _driver(1, [])
    resumed.group.weights = 1  # a fresh engine; resuming sends it the checkpoint's weights (version 2)
    resumed.load(str(tmp_path))
    resumed.set_version(2)
    # the data loader resumes after batch 2 (drawn before the checkpoint); batch 2 itself comes from the file
    assert _train(resumed, 4, first_batch=3, first_step=3) == straight[2:]
    assert resumed.group.log[0] == ("receive", 2) and ("gen", 4, 2) in resumed.group.log
