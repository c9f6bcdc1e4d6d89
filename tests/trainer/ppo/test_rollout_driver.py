"""`SplitRollouts` ordering without Ray: which weights each batch is generated with, what a checkpoint keeps,
how a resumed driver continues, and what a failed weight transfer says. Stand-in groups record the order of
calls, as a Ray actor serves them."""

import pytest
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.single_controller.ray.diagnostics import WorkerInfo
from rlpost.trainer.ppo.rollout_driver import PREPARED, SplitRollouts, WeightTransferError
from rlpost.checkpoint.manager import CheckpointManager, build_manifest

pytestmark = pytest.mark.timeout(60)


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

    def update_actor(self, batch):
        return batch


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


def test_an_update_never_sent_is_sent_before_the_next_generation():
    """A recipe's own loop that updates the actor without `checkpoint_manager.update_weights()`: the next
    generation (and validation's) still gets the new weights, once."""
    log = []
    driver = _driver(0, log)
    batches = driver.batches({K.INPUT_IDS: torch.full((2, 3), i)} for i in range(3))
    prompts = next(batches)
    first = driver.generate(prompts)
    driver.actor_group.update_actor(first)  # no sync_weights
    second = driver.generate(next(batches))
    assert int(second.batch[K.RESPONSES][0, 0]) == 1 and log[-2:] == [("receive", 1), ("gen", 2, 1)]
    driver.generate_sequences(_gen_inputs(prompts, step=2))  # nothing new to send
    assert [e for e in log if e[0] == "receive"] == [("receive", 1)]
    driver.actor_group.update_actor(second)
    driver.sync_weights({})  # the trainer's own loop: sent once, not again at the next generation
    driver.generate(next(batches))
    assert [e for e in log if e[0] == "receive"] == [("receive", 1), ("receive", 2)]


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


class Failed:
    """A future whose call failed: `get()` raises `error`."""

    def __init__(self, error):
        self.error = error

    def get(self):
        raise self.error


class DeadRollout(RolloutGroup):
    """Its process ends inside the receive of transfer `dies_at` (or the generation for step `dies_in_gen`):
    that call and every later one fail, a dispatch raises at once, `dead_workers` reports it as Ray would."""

    name = "rollout_pool/rollout"
    workers = [WorkerInfo(0, 4242, "host", "stack.txt", "/logs/worker_rollout_rank0_pid4242.log")]

    def __init__(self, log, dies_at=None, dies_in_gen=None):
        super().__init__(log)
        self.dies_at, self.dies_in_gen, self.dead = dies_at, dies_in_gen, False

    def generate_sequences(self, gen):
        if self.dead:
            raise RuntimeError("rollout_pool/rollout.get_dispatch_info failed on rank(s) [0]: died")
        if gen.meta_info[K.META_GLOBAL_STEP] == self.dies_in_gen:
            self.dead = True
            return Failed(RuntimeError("rollout_pool/rollout.generate_sequences failed on rank(s) [0]: died"))
        return super().generate_sequences(gen)

    def receive_weights(self):
        if self.dead or self.weights + 1 == self.dies_at:
            self.dead = True
            return Failed(RuntimeError("rollout_pool/rollout.receive_weights failed on rank(s) [0]"))
        return super().receive_weights()

    def dead_workers(self):
        return {0: "The actor died unexpectedly before finishing this task.\nworker exit type: SYSTEM_ERROR"} \
            if self.dead else {}


class SendingActor(ActorGroup):
    """The trainer's side: its broadcast fails once the receiver is gone."""

    name = "actor_pool/actor"
    workers = [WorkerInfo(0, 1111, "host", "stack.txt", "/logs/worker_actor_rank0_pid1111.log")]

    def __init__(self, rollout):
        self.rollout = rollout

    def send_weights(self):
        if self.rollout.dead or self.rollout.weights + 1 == self.rollout.dies_at:
            return Failed(RuntimeError("actor_pool/actor.send_weights failed on rank(s) [0]: [gloo] Connection "
                                       "closed by peer"))
        return super().send_weights()

    def dead_workers(self):
        return {}


def test_rollout_worker_dying_in_the_transfer_is_named_with_the_phase_and_the_checkpoint(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    manager.begin(2)
    manager.commit(2, build_manifest(2, 0, 1))
    rollout = DeadRollout([], dies_at=2)  # the transfer after step 2
    driver = SplitRollouts(SendingActor(rollout), rollout, 1, _prepare, _gen_inputs, str(tmp_path))
    with pytest.raises(WeightTransferError) as info:
        _train(driver, 4)
    text = str(info.value)
    assert text.startswith("update_weights (the weight transfer to the rollout pool, policy version 2) failed: "
                           "rollout_pool/rollout rank 0 (pid 4242) died; its output is in "
                           "/logs/worker_rollout_rank0_pid4242.log\n  Ray: The actor died unexpectedly")
    assert f"The newest checkpoint, {tmp_path / 'global_step_2'} (step 2), is complete" in text
    assert "actor_pool/actor" not in text and "gloo" in str(info.value.__cause__)  # the trainer's error: the cause


def test_transfer_failure_without_a_dead_worker_names_the_error_and_no_checkpoint(tmp_path):
    rollout = DeadRollout([], dies_at=1)
    rollout.dead_workers = lambda: {}  # the receiver raised but lives on (e.g. an engine error)
    driver = SplitRollouts(SendingActor(rollout), rollout, 0, _prepare, _gen_inputs, str(tmp_path / "run"))
    with pytest.raises(WeightTransferError) as info:
        _train(driver, 2)
    assert str(info.value) == ("update_weights (the weight transfer to the rollout pool, policy version 1) failed: "
                               "actor_pool/actor.send_weights failed on rank(s) [0]: [gloo] Connection closed by "
                               f"peer\nNo checkpoint had been saved under {tmp_path / 'run'}.")


def test_a_generation_that_died_before_the_transfer_is_named_not_the_transfer(tmp_path):
    """The engine dies generating the batch of step 3 (submitted before the weights of step 2 were sent): the
    next dispatch fails, and the error raised is that generation's (the engine runs its calls in order)."""
    rollout = DeadRollout([], dies_in_gen=3)
    driver = SplitRollouts(SendingActor(rollout), rollout, 1, _prepare, _gen_inputs, str(tmp_path))
    with pytest.raises(RuntimeError) as info:
        _train(driver, 4)
    assert not isinstance(info.value, WeightTransferError)
    assert str(info.value) == "rollout_pool/rollout.generate_sequences failed on rank(s) [0]: died"


def test_validation_after_a_failed_transfer_names_the_transfer(tmp_path):
    """One step off: the transfer after step 1 is queued behind the next generation; the rollout worker dies in
    it, and a validation generation (`generate_sequences`) is what meets the dead worker first."""
    rollout = DeadRollout([], dies_at=1)
    driver = SplitRollouts(SendingActor(rollout), rollout, 1, _prepare, _gen_inputs, str(tmp_path))
    driver.sync_weights({})  # queued, not awaited (staleness 1)
    with pytest.raises(WeightTransferError, match=r"^update_weights \(the weight transfer to the rollout pool, "
                                                  r"policy version 1\) failed: rollout_pool/rollout rank 0"):
        driver.generate_sequences(_gen_inputs(_prepare(DataProto.from_single_dict({K.INPUT_IDS: torch.zeros(2, 3)})), 1))
