"""Bucketed weight gather and forward prefetch on 2 gloo ranks: the bucketed sync yields exactly the
per-tensor `full_tensor()` values, in the same order, with one all-gather per bucket (uneven and empty
shards included); forward prefetch leaves the loss and the gradients unchanged; `reshard` frees the parameters
a no-grad pass left gathered under reshard_after_forward=False."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workers"))
from _fsdp_helpers import spawn  # noqa: E402

from rlpost.engine.fsdp_gather import chunk_rows  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _gathers(model, **kwargs) -> tuple[list, int]:
    """(name, full tensor) pairs of `iter_full_params` and how many bucket all-gathers they took."""
    from rlpost.engine import fsdp_gather
    from rlpost.engine.fsdp import iter_full_params

    calls = []
    real = fsdp_gather.all_gather_flat

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    fsdp_gather.all_gather_flat = counting
    try:
        return [(n, t.clone()) for n, t in iter_full_params(model, **kwargs)], len(calls)
    finally:
        fsdp_gather.all_gather_flat = real


def _run(rank: int, model_dir: str, out: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlpost.engine.fsdp import apply_fsdp2

    dist.init_process_group("gloo")
    res = {}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_fsdp2(model, "cpu", fsdp_size=-1, reshard_after_forward=True, offload_policy=False, min_num_params=0)
    res["per_tensor"], _ = _gathers(model, dtype=torch.bfloat16)
    res["bucketed"], res["buckets"] = _gathers(model, dtype=torch.bfloat16, bucket_bytes=64 * 1024)
    res["one_bucket"], res["one_bucket_calls"] = _gathers(model, dtype=torch.bfloat16, bucket_bytes=2**30)
    # Uneven dim-0 shards: 3 rows -> [2, 1]; 1 row -> [1, 0] (rank 1 holds nothing).
    torch.manual_seed(0)
    odd = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    apply_fsdp2(odd, "cpu", fsdp_size=-1, reshard_after_forward=True, offload_policy=False, min_num_params=0)
    res["odd_per_tensor"], _ = _gathers(odd)
    res["odd_bucketed"], res["odd_buckets"] = _gathers(odd, bucket_bytes=1024)
    res["odd_expected"] = {k: v.full_tensor().clone() for k, v in odd.state_dict().items()}
    res["prefetch"] = _prefetch_grads(model_dir)
    res["reshard"] = _reshard_after_pass(model_dir)
    if rank == 0:
        torch.save(res, out)


def _prefetch_grads(model_dir: str) -> dict[bool, tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """Loss and full gradients of one forward/backward, with and without forward prefetch."""
    from transformers import AutoModelForCausalLM

    from rlpost.engine.fsdp import apply_fsdp2

    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    result = {}
    for prefetch in (False, True):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        apply_fsdp2(model, "cpu", fsdp_size=-1, reshard_after_forward=True, offload_policy=False, min_num_params=0,
                    forward_prefetch=prefetch)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
        result[prefetch] = (loss.detach(), grads)
    return result


def _reshard_after_pass(model_dir: str) -> dict[str, object]:
    """reshard_after_forward=False: gathered parameters after a no-grad forward, none after `reshard`; the
    logits the same in a second forward (gathered) and after resharding."""
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from rlpost.engine.fsdp import apply_fsdp2, reshard

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_fsdp2(model, "cpu", fsdp_size=-1, reshard_after_forward=False, offload_policy=False, min_num_params=0)
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(2))

    def gathered() -> int:
        return sum(not isinstance(p, DTensor) for p in model.parameters())

    out = {"before": gathered()}
    with torch.no_grad():
        logits = [model(input_ids=ids).logits]
        out["after_forward"] = gathered()
        logits.append(model(input_ids=ids).logits)
        reshard(model)
        out["after_reshard"] = gathered()
        logits.append(model(input_ids=ids).logits)
    reshard(model)
    out["same_logits"] = all(torch.equal(logits[0], x) for x in logits[1:])
    return out


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gather")
    out = str(tmp / "res.pt")
    spawn(_run, (tiny_model_dir, out), str(tmp))
    return torch.load(out, weights_only=False)


def test_chunk_rows_follows_torch_chunk():
    for rows in range(0, 9):
        for world in (1, 2, 3, 4):
            expected = [c.shape[0] for c in torch.arange(rows).chunk(world)] if rows else []
            got = chunk_rows(rows, world)
            assert sum(got) == rows and got[:len(expected)] == expected and not any(got[len(expected):])


def test_bucketed_gather_equals_per_tensor_exactly(results):
    per_tensor, bucketed = results["per_tensor"], results["bucketed"]
    assert [n for n, _ in bucketed] == [n for n, _ in per_tensor]
    for (name, a), (_, b) in zip(per_tensor, bucketed):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), name
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(per_tensor, results["one_bucket"]))
    # one collective per greedy bucket of <= 64 KiB of full bf16 tensors (a bigger tensor goes alone)
    buckets, size = 0, 0
    for _, t in per_tensor:
        nbytes = t.numel() * t.element_size()
        if size and size + nbytes > 64 * 1024:
            buckets, size = buckets + 1, 0
        size += nbytes
    assert results["buckets"] == buckets + 1 < len(per_tensor)
    assert results["one_bucket_calls"] == 1


def test_bucketed_gather_handles_uneven_and_empty_shards(results):
    expected = results["odd_expected"]
    assert [n for n, _ in results["odd_bucketed"]] == list(expected)
    for name, t in results["odd_bucketed"]:
        assert torch.equal(t, expected[name]), name
    for name, t in results["odd_per_tensor"]:
        assert torch.equal(t, expected[name]), name
    assert results["odd_buckets"] == 1


def test_forward_prefetch_keeps_loss_and_grads(results):
    (loss_a, grads_a), (loss_b, grads_b) = results["prefetch"][False], results["prefetch"][True]
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_reshard_frees_what_a_pass_left_gathered(results):
    r = results["reshard"]
    assert r["before"] == 0 and r["after_forward"] > 0 and r["after_reshard"] == 0
    assert r["same_logits"]
