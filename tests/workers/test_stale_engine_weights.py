"""The hybrid engine never samples from weights older than the actor's: an actor step taken outside `update_actor`
(a recipe's own worker method, which verl's hybrid engine also covers by syncing on entering generation) is synced
into the engine at the next `generate_sequences`, once. 2 gloo ranks, tiny model, a recording engine."""

from __future__ import annotations

import pytest
import torch

from rlpost import keys
from _fsdp_helpers import arr_config, make_batch, spawn
from _fsdp_helpers import shard_of as _proto

pytestmark = pytest.mark.timeout(280)


class RecordingEngine:
    """Stands in for vLLM: keeps what the worker streams into it and the order of the calls."""

    def __init__(self, config, model_path, tokenizer, device, module=None, **kwargs) -> None:
        self.values: dict[str, torch.Tensor] = {}
        self.calls: list[str] = []
        self.needs_sync = False

    def update_weights(self, named_tensors) -> None:
        self.calls.append("update_weights")
        self.values = {name: t.detach().clone() for name, t in named_tensors}

    def generate_sequences(self, prompts):
        self.calls.append("generate_sequences")
        return prompts

    def sleep(self) -> None:
        self.calls.append("sleep")

    def wake_up(self) -> None:
        self.calls.append("wake_up")


def _run(rank: int, model_dir: str, out: str) -> None:
    from rlpost.engine.fsdp import iter_full_params
    from rlpost.rollout import ROLLOUT_REGISTRY
    from rlpost.utils.weight_names import checkpoint_names
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    if "recording_stale" not in ROLLOUT_REGISTRY:
        ROLLOUT_REGISTRY.register("recording_stale")(RecordingEngine)
    w = ActorRolloutRefWorker(arr_config(model_dir, rollout="recording_stale"), role="actor_rollout")
    w.init_model(total_training_steps=10)
    batch = make_batch(len(w.tokenizer))
    initial = dict(w.rollout.values)
    old = w.compute_log_prob(_proto(batch, rank, 2)).batch[keys.OLD_LOG_PROBS]
    # A recipe's own training method: the actor's update without update_actor's weight sync.
    data = _proto(batch, rank, 2)
    data.batch[keys.OLD_LOG_PROBS], data.batch[keys.ADVANTAGES] = old, torch.ones_like(old)
    w.actor.update_policy(data)
    w.rollout.calls.clear()
    steps_before = w.actor_steps.unsynced_steps
    w.generate_sequences(_proto(batch, rank, 2))
    first_calls = list(w.rollout.calls)
    w.rollout.calls.clear()
    w.generate_sequences(_proto(batch, rank, 2))
    trained = {n: t.clone() for n, t in checkpoint_names(w.actor_module, iter_full_params(w.actor_module, None))}
    if rank == 0:
        torch.save({"initial": initial, "synced": w.rollout.values, "trained": trained, "steps": steps_before,
                    "first": first_calls, "second": list(w.rollout.calls)}, out)


@pytest.fixture(scope="module")
def result(tiny_model_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("stale"))
    spawn(_run, (tiny_model_dir, f"{tmp}/out.pt"), tmp)
    return torch.load(f"{tmp}/out.pt", weights_only=False)


def test_an_unsynced_actor_step_is_synced_on_entering_generation(result):
    # 4 rows per rank in mini-batches of 2 rows: two optimizer steps, each seen by the post-step hook
    assert result["steps"] == 2
    assert result["first"][:3] == ["update_weights", "wake_up", "generate_sequences"]
    assert "update_weights" not in result["second"]  # synced once, not at every generation
    names = sorted(result["trained"])
    assert sorted(result["synced"]) == names
    moved = [n for n in names if not torch.equal(result["initial"][n], result["trained"][n].to(result["initial"][n].dtype))]
    assert moved, "the update changed no weight"
    for n in names:  # the engine holds the trained weights (in its dtype), not the initial ones
        synced = result["synced"][n]
        torch.testing.assert_close(synced, result["trained"][n].to(synced.dtype), rtol=0, atol=0)
