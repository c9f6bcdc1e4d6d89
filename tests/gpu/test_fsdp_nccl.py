"""FSDP2 over nccl on every visible GPU (1 on one-GPU hosts, 2 on the x2 host): forward, backward, clipping
and AdamW through `rlpost.engine.fsdp` match a plain single-device model step for step."""

from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from rlpost.utils.distributed import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

STEPS, ROWS, SEQ = 3, 8, 32


def _batch(vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (ROWS, SEQ), generator=torch.Generator().manual_seed(0))


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (a sum over this rank's rows / all rows, so ranks add up)."""
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                             reduction="sum") / (ROWS * (SEQ - 1))


def _reference(model_dir: str) -> list[float]:
    """Losses of STEPS AdamW steps of the unsharded model on one GPU (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = _batch(model.config.vocab_size).cuda()
    losses = []
    for _ in range(STEPS):
        loss = _loss(model, ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _worker(rank: int, world: int, port: int, model_dir: str, out: dict, err_dir: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import torch.distributed as dist

    try:
        from transformers import AutoModelForCausalLM

        from rlpost.utils.distributed import init_distributed
        from rlpost.engine.fsdp import apply_fsdp2, clip_grad_norm, iter_full_params

        init_distributed("cuda")
        assert dist.get_backend() in ("nccl", "cpu:gloo,cuda:nccl"), dist.get_backend()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        apply_fsdp2(model, "cuda", fsdp_size=-1, reshard_after_forward=True, offload_policy=False, min_num_params=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = _batch(model.config.vocab_size).cuda()
        share = ids[rank * ROWS // world:(rank + 1) * ROWS // world]
        losses = []
        for _ in range(STEPS):
            loss = _loss(model, share)
            loss.backward()
            # FSDP2 averages gradients over ranks; the loss is a per-rank share of the global mean
            for p in model.parameters():
                p.grad.mul_(world)
            clip_grad_norm(model, 1.0)
            opt.step()
            opt.zero_grad()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(total.item())
        checksum = sum(t.double().sum().item() for _, t in iter_full_params(model))
        per_tensor = [t.clone() for _, t in iter_full_params(model, torch.bfloat16)]
        bucketed = [t for _, t in iter_full_params(model, torch.bfloat16, bucket_bytes=2**16)]  # weight-sync path
        same = all(torch.equal(a, b) for a, b in zip(per_tensor, bucketed)) and len(per_tensor) == len(bucketed)
        if rank == 0:
            out["losses"], out["checksum"], out["bucketed_equal"] = losses, checksum, same
        else:
            out[f"checksum_{rank}"] = checksum
    except BaseException:
        with open(os.path.join(err_dir, f"err_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_fsdp2_nccl_matches_single_gpu(tiny_model_dir, tmp_path):
    world = torch.cuda.device_count()
    port = free_port()
    with mp.Manager() as manager:
        out = manager.dict()
        try:
            mp.spawn(_worker, args=(world, port, tiny_model_dir, out, str(tmp_path)), nprocs=world, join=True)
        except Exception as exc:
            errs = [p.read_text() for p in tmp_path.glob("err_*.txt")]
            raise AssertionError("\n".join(errs) or str(exc)) from exc
        out = dict(out)
    ref = _reference(tiny_model_dir)
    assert len(out["losses"]) == STEPS
    assert out["losses"] == pytest.approx(ref, rel=2e-4, abs=2e-4)
    assert out["losses"][-1] < out["losses"][0]
    assert out["bucketed_equal"]  # one NCCL all-gather per 64 KiB bucket gives the per-tensor values exactly
    for rank in range(1, world):
        assert out[f"checksum_{rank}"] == pytest.approx(out["checksum"], rel=1e-9)
