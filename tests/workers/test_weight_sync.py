"""Split placement's weight transfer (`rlpost.workers.weight_sync`): two FSDP2 trainer ranks and one rollout
rank in separate default groups (as in two Ray pools), joined by a gloo transfer group of their own."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from rlpost.utils.distributed import free_port
from rlpost.workers import weight_sync
from rlpost.workers.weight_sync import TensorMeta, plan_buckets


def test_plan_buckets_packs_in_order_and_splits_by_size_and_dtype():
    f32, bf16 = torch.float32, torch.bfloat16
    metas = [TensorMeta("a", (4,), f32), TensorMeta("b", (2, 2), f32), TensorMeta("c", (10,), f32),
             TensorMeta("d", (1,), bf16), TensorMeta("e", (1,), f32)]
    buckets = plan_buckets(metas, bucket_bytes=32)
    assert [[m.name for m in b] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]  # c (40 B) alone


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 50))


def _trainer(rank: int, port: int, sync_port: int, out_file: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from rlpost.engine.fsdp import iter_full_params

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = _model()
    with torch.no_grad():  # weights the rollout's copy does not have
        for p in model.parameters():
            p.add_(1.0)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    metas = [TensorMeta(n, tuple(t.shape), torch.bfloat16) for n, t in model.state_dict().items()]
    group = weight_sync.connect("127.0.0.1", sync_port, 0, 2, "cpu", 60) if rank == 0 else None
    sent = weight_sync.send(group, iter_full_params(model, torch.bfloat16), metas, bucket_bytes=1024)
    full = {n: t.clone() for n, t in iter_full_params(model, torch.bfloat16)}
    if rank == 0:
        torch.save({"metas": metas, "full": full, "sent": sent}, out_file)
    # Teardown in a fixed order: no collective in flight (barrier), no sharded tensor left for gloo's threads to
    # release during interpreter shutdown (CI once saw rank 1 end with SIGABRT, "terminate called without an
    # active exception", after the work was done; pytorch#190489 / #179291 describe that exit race).
    del model, full
    dist.barrier()
    dist.destroy_process_group()


def _rollout(sync_port: int, out_file: str) -> None:
    engine = _model().to(torch.bfloat16)
    state = engine.state_dict()
    before = {n: t.clone() for n, t in state.items()}
    metas = [TensorMeta(n, tuple(t.shape), torch.bfloat16) for n, t in state.items()]  # sent by the driver
    group = weight_sync.connect("127.0.0.1", sync_port, 1, 2, "cpu", 60)
    for name, tensor in weight_sync.receive(group, metas, 1024, "cpu"):
        state[name].copy_(tensor)
    torch.save({"received": engine.state_dict(), "before": before}, out_file)


@pytest.mark.timeout(180)
def test_trainer_weights_reach_the_rollout_rank(tmp_path):
    ctx = mp.get_context("spawn")
    port, sync_port = free_port(), free_port()
    procs = [ctx.Process(target=_rollout, args=(sync_port, str(tmp_path / "rollout.pt")))]
    procs += [ctx.Process(target=_trainer, args=(r, port, sync_port, str(tmp_path / "trainer.pt"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(150)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    out = torch.load(tmp_path / "trainer.pt", weights_only=False)
    got = torch.load(tmp_path / "rollout.pt")
    assert len(plan_buckets(out["metas"], 1024)) > 2  # several buckets were sent
    assert out["sent"] == sum(m.nbytes for m in out["metas"])
    for name, tensor in out["full"].items():
        assert torch.equal(got["received"][name], tensor), name  # the trainer's values, exactly
        assert not torch.equal(got["before"][name], got["received"][name]), name  # they replaced the old ones
