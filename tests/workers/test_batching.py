"""Per-rank batching: rows per rank from global prompt counts, mini-batch shuffling, micro-batch checks, and
`train_epochs` driven by the composed actor config plus the explicit `mini_batch_rows`."""

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.workers.batching import micro_batches, mini_batches, rows_per_rank, train_epochs


def test_rows_per_rank():
    assert rows_per_rank(4, 1, 2, "actor.ppo_mini_batch_size") == 2
    assert rows_per_rank(4, 5, 2, "actor.ppo_mini_batch_size") == 10  # 4 prompts x 5 responses over 2 ranks
    with pytest.raises(ValueError, match=r"critic.ppo_mini_batch_size=3 x rollout.n=1 = 3 rows .* size 2"):
        rows_per_rank(3, 1, 2, "critic.ppo_mini_batch_size")


def test_mini_batch_shuffle_seeded_or_global():
    rows = {"x": torch.arange(6)}
    plain = [m["x"].tolist() for m in mini_batches(rows, 3, False, None, 0)]
    assert plain == [[0, 1, 2], [3, 4, 5]]
    seeded = [m["x"].tolist() for m in mini_batches(rows, 3, True, 7, 1)]
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(7 + 1)).tolist()  # seed + epoch
    assert seeded == [perm[:3], perm[3:]]
    torch.manual_seed(0)
    a = [m["x"].tolist() for m in mini_batches(rows, 3, True, None, 0)]
    torch.manual_seed(0)
    assert a == [m["x"].tolist() for m in mini_batches(rows, 3, True, None, 0)]  # global generator
    with pytest.raises(ValueError, match="not divisible into mini-batches of 4 rows"):
        mini_batches(rows, 4, False, None, 0)


def test_micro_batch_size_required_without_dynamic_bsz():
    rows = {keys.ATTENTION_MASK: torch.ones(4, 3, dtype=torch.long)}
    assert len(micro_batches(rows, 2, False, 0)[0]) == 2
    assert len(micro_batches(rows, None, True, 6)[0]) == 2  # dynamic: by token count, size unused
    with pytest.raises(ValueError, match="micro batch size must be > 0"):
        micro_batches(rows, None, False, 0)


def test_train_epochs_steps_per_mini_batch_and_epoch():
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ppo_epochs=2",
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1").actor_rollout_ref.actor
    torch.manual_seed(0)
    module = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    rows = {"x": torch.ones(4, 1), keys.RESPONSE_MASK: torch.ones(4, 1)}
    seen = []

    def micro_loss(mb):
        seen.append(mb["x"].shape[0])
        loss = module(mb["x"]).mean()
        return loss, {"loss": loss.detach()}

    metrics = train_epochs(module, opt, cfg, rows, micro_loss, "actor", mini_batch_rows=2, shuffle_seed=None)
    assert cfg.ppo_mini_batch_size == 4  # the config keeps prompts; the rows per rank came in explicitly
    assert len(metrics["actor/grad_norm"]) == 4  # 2 epochs x (4 rows / 2 rows per mini-batch)
    assert seen == [1] * 8  # micro-batches of ppo_micro_batch_size_per_gpu=1


def _deferred_sync(rank: int, tmp: str) -> None:
    """Two ranks, an FSDP2 two-layer model, 3 micro-batches per mini-batch: the weights after two optimiser steps
    with the gradient sync deferred to the last micro-batch, and with it after each; and how many times each
    rank's module was asked to sync."""
    import torch.distributed as dist

    from rlpost.engine.fsdp import apply_fsdp2

    dist.init_process_group("gloo")
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                         "actor_rollout_ref.actor.loss_agg_mode=token-mean").actor_rollout_ref.actor
    g = torch.Generator().manual_seed(rank)
    rows = {"x": torch.randn(12, 4, generator=g), keys.RESPONSE_MASK: torch.ones(12, 1)}
    out = {}
    for defer in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        apply_fsdp2(model, "cpu", fsdp_size=-1, reshard_after_forward=True, offload_policy=False, min_num_params=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        calls: list[bool] = []

        def counted(flag, _calls=calls, _inner=model.set_requires_gradient_sync, **kw):
            _calls.append(flag)
            return _inner(flag, **kw)

        def loss(mb, _model=model):
            return (_model(mb["x"]) ** 2).mean(), {}

        model.set_requires_gradient_sync = counted
        train_epochs(model, opt, cfg, rows, loss, "actor", mini_batch_rows=6, shuffle_seed=0, defer_grad_sync=defer)
        out[defer] = ([p.full_tensor().detach().clone() for p in model.parameters()], calls)
    if rank == 0:
        torch.save(out, f"{tmp}/deferred.pt")


@pytest.mark.timeout(180)
def test_deferred_gradient_sync_gives_the_same_update(tmp_path):
    from _fsdp_helpers import spawn

    spawn(_deferred_sync, (str(tmp_path),), str(tmp_path))
    out = torch.load(tmp_path / "deferred.pt", weights_only=False)
    (each, each_calls), (deferred, deferred_calls) = out[False], out[True]
    # 2 mini-batches of 3 micro-batches, the sync on for the last; and on again after each (also after an error)
    assert each_calls == [] and deferred_calls == [False, False, True, True] * 2
    for a, b in zip(each, deferred):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
