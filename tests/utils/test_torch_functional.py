"""verl's torch_functional additions: sum of squared probabilities, distributed statistics, expand_as_nested."""

import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlpost.utils import torch_functional as verl_F


def test_sum_pi_squared_from_logits_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1.0, 1.0, 1.0]]))  # probabilities given directly
    out = verl_F.calculate_sum_pi_squared_from_logits(logits)
    assert torch.allclose(out, torch.tensor([0.25 + 0.0625 + 0.0625, 1 / 3]), atol=1e-6)
    big = verl_F.calculate_sum_pi_squared_from_logits(torch.tensor([[1000.0, 0.0]]))
    assert torch.allclose(big, torch.tensor([1.0]))  # no overflow


def test_distributed_stats_without_a_process_group():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0])
    mean, high, low, std = verl_F.distributed_mean_max_min_std(x)
    assert (float(mean), float(high), float(low)) == (3.0, 6.0, 1.0)
    assert float(std) == pytest.approx(math.sqrt((4 + 1 + 0 + 9) / 3))
    assert verl_F.distributed_mean_max_min_std(x, compute_max=False, compute_std=False)[1::2] == (None, None)
    assert float(verl_F.distributed_masked_mean(x, torch.tensor([1, 0, 1, 0]))) == 2.0


def _rank(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        local = torch.tensor([1.0, 2.0]) if rank == 0 else torch.tensor([3.0, 6.0, 8.0])
        mask = torch.tensor([1, 1]) if rank == 0 else torch.tensor([0, 1, 1])
        stats = verl_F.distributed_mean_max_min_std(local)
        out[rank] = [float(s) for s in stats] + [float(verl_F.distributed_masked_mean(local, mask))]
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(120)
def test_distributed_stats_over_two_gloo_ranks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(port, out), nprocs=2, join=True)
        results = dict(out)
    values = [1.0, 2.0, 3.0, 6.0, 8.0]  # both ranks together: mean 4, sample std about it
    std = math.sqrt(sum((v - 4.0) ** 2 for v in values) / 4)
    for rank in (0, 1):
        assert results[rank][:3] == [4.0, 8.0, 1.0] and results[rank][3] == pytest.approx(std)
        assert results[rank][4] == pytest.approx((1 + 2 + 6 + 8) / 4)


def test_expand_as_nested():
    nested = torch.nested.as_nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    out = verl_F.expand_as_nested(torch.tensor([5.0, 7.0]), nested)
    assert [t.tolist() for t in out.unbind()] == [[5.0, 5.0], [7.0, 7.0, 7.0]]
    with pytest.raises(ValueError, match="must be \\(2,\\)"):
        verl_F.expand_as_nested(torch.ones(3), nested)
    with pytest.raises(ValueError, match="nested"):
        verl_F.expand_as_nested(torch.ones(2), torch.zeros(2, 3))
