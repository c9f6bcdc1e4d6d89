"""Rank 0 alone reads an untied model's weights; the other ranks build it empty and receive their shards: the
shards, buffers and forward equal those of every rank reading the checkpoint (2 processes, FSDP2 over gloo; on
a host with 2 GPUs also over nccl, the path main_ppo takes there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _fsdp_helpers import arr_config, spawn

pytestmark = pytest.mark.timeout(240)


def _untied_copy(tied_dir: str, out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tied_dir, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 1.5)  # untied and different
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tied_dir).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    return out


def _compare(rank: int, untied: str, tied: str, device: str = "cpu") -> None:
    from rlpost.utils.distributed import init_distributed
    from rlpost.engine.fsdp import apply_fsdp2, load_shards_from_rank0
    from rlpost.utils.model import load_for_sharding, load_model, loads_on_rank0_only

    init_distributed(device)
    assert not loads_on_rank0_only(arr_config(tied).model)  # tied embeddings: every rank reads
    cfg = arr_config(untied).model
    assert loads_on_rank0_only(cfg)
    kwargs = dict(fsdp_size=-1, reshard_after_forward=True, offload_policy=False, min_num_params=0)
    every = apply_fsdp2(load_model(cfg, torch.float32), device, **kwargs)
    received, full = load_for_sharding(cfg, torch.float32)
    assert (full != {}) == (rank == 0)  # rank 0 holds the weights, the others nothing
    assert all(p.is_meta for p in received.parameters()) == (rank != 0)
    apply_fsdp2(received, device, **kwargs)
    load_shards_from_rank0(received, full)
    a, b = every.state_dict(), received.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name].to_local(), b[name].to_local()), name
    for (name, x), (_, y) in zip(every.named_buffers(), received.named_buffers()):
        assert torch.equal(x, y), name
    ids = torch.arange(3, 19, device=device).reshape(2, 8)
    with torch.no_grad():
        assert torch.equal(every(input_ids=ids).logits, received(input_ids=ids).logits)


def test_rank0_load_gives_the_same_shards_buffers_and_forward(tiny_model_dir, tmp_path):
    untied = _untied_copy(tiny_model_dir, tmp_path / "untied")
    spawn(_compare, (str(untied), tiny_model_dir), str(tmp_path))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_rank0_load_over_nccl(tiny_model_dir, tmp_path):
    untied = _untied_copy(tiny_model_dir, tmp_path / "untied")
    spawn(_compare, (str(untied), tiny_model_dir, "cuda"), str(tmp_path))
