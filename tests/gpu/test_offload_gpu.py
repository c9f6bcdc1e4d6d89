"""On a GPU: param_offload's round trip (`offload_model` / `load_model_to`) keeps every parameter
bit-identical, its host copies are pinned, and the sharded model runs the same forward afterwards."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from rlpost.utils.distributed import free_port
from rlpost.engine.fsdp import load_model_to, offload_model

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


def test_offload_round_trip_is_exact_pinned_and_runs(monkeypatch):
    assert not dist.is_initialized(), "an earlier test left its process group up"
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        _round_trip()
    finally:
        dist.destroy_process_group()


def _round_trip() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4))).to("cuda", torch.bfloat16)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    x = torch.randn(3, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
    before = [p.to_local().clone() for p in model.parameters()]
    for _ in range(2):
        offload_model(model)
        assert all(p.to_local().device.type == "cpu" and p.to_local().is_pinned() for p in model.parameters())
        load_model_to(model, "cuda")
        assert all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
    with torch.no_grad():
        assert torch.equal(model(x), expected)
