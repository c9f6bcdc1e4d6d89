"""Tensor-parallel rollout peers: every rank gets its own shard from the trainer, the peers of one engine
must generate the union of their shards together and each get back exactly its own rows (2 gloo ranks,
the real HF rollout standing for the engine the peers share)."""

from __future__ import annotations

import pytest
import torch

from _fsdp_helpers import arr_config, make_batch, spawn
from rlpost import keys
from rlpost.protocol import DataProto

pytestmark = pytest.mark.timeout(240)


def _prompts(batch: dict, rank: int) -> DataProto:
    rows = slice(4 * rank, 4 * rank + 4)  # different prompts on each rank
    out = DataProto.from_dict({k: batch[k][rows] for k in (keys.INPUT_IDS, keys.ATTENTION_MASK)})
    out.batch[keys.POSITION_IDS] = (out.batch[keys.ATTENTION_MASK].cumsum(-1) - 1).clamp(min=0)
    out.meta_info.update({keys.META_DO_SAMPLE: False, keys.META_VALIDATE: False})
    return out


def _run(rank: int, model_dir: str, tmp: str) -> None:
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = arr_config(model_dir, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "data.max_prompt_length=6",
                     "data.max_response_length=4", "actor_rollout_ref.rollout.do_sample=false",
                     "actor_rollout_ref.rollout.free_cache_engine=false")
    w = ActorRolloutRefWorker(cfg, role="actor_rollout")
    w.init_model(total_training_steps=1)
    batch = make_batch(w.tokenizer.vocab_size)
    seen: list[int] = []  # rows the engine was handed
    generate = w.rollout.generate_sequences
    w.rollout.generate_sequences = lambda data: seen.append(len(data)) or generate(data)
    out = w.generate_sequences(_prompts(batch, rank))
    assert seen == [8], seen  # both shards, on both peers
    # what the shared engine produces for both shards at once, computed here directly
    both = generate(DataProto.concat([_prompts(batch, 0), _prompts(batch, 1)]))
    assert len(out) == 4
    assert torch.equal(out.batch[keys.PROMPTS], _prompts(batch, rank).batch[keys.INPUT_IDS])
    assert torch.equal(out.batch[keys.RESPONSES], both.batch[keys.RESPONSES][4 * rank:4 * rank + 4])
    torch.save(out.batch[keys.RESPONSES], f"{tmp}/resp_{rank}.pt")


def test_tp_peers_generate_together_and_keep_their_own_rows(tiny_model_dir, tmp_path):
    spawn(_run, (str(tiny_model_dir), str(tmp_path)), str(tmp_path))
    r0, r1 = torch.load(tmp_path / "resp_0.pt"), torch.load(tmp_path / "resp_1.pt")
    assert r0.shape == r1.shape == (4, 4)
