"""The actor worker on one GPU: a batch handed over on CPU (as Ray delivers it) comes back as CPU log-probs
equal to a plain HF forward, and remove-padding (packed rows, SDPA) gives the padded path's log-probs:
packed sequences do not attend to each other."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from rlpost.utils.distributed import free_port
from rlpost import keys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))
from _fsdp_helpers import arr_config, make_batch  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    """`ActorRolloutRefWorker(role="actor")`, rank 0 of 1 over nccl, fp32 compute for exact comparisons."""
    import torch.distributed as dist

    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    port = free_port()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "RLPOST_DEVICE": "cuda"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cfg = arr_config(str(tiny_model_dir), "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32")
    w = ActorRolloutRefWorker(cfg, role="actor")
    w.init_model()
    yield w
    dist.destroy_process_group()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _proto(batch: dict):
    from rlpost.protocol import DataProto

    return DataProto.from_dict(tensors=batch, meta_info={keys.META_TEMPERATURE: TEMPERATURE})


@torch.no_grad()
def _reference(model_dir, batch: dict) -> torch.Tensor:
    """(B, R) log-probs of the responses from a plain HF forward (fp32, full logits, padded)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    ids = batch[keys.INPUT_IDS].cuda()
    r = batch[keys.RESPONSES].shape[1]
    logits = model(input_ids=ids, attention_mask=batch[keys.ATTENTION_MASK].cuda(),
                   position_ids=batch[keys.POSITION_IDS].cuda(), use_cache=False).logits[:, -r - 1:-1]
    logp = torch.log_softmax(logits.float() / TEMPERATURE, -1)
    return logp.gather(-1, ids[:, -r:, None]).squeeze(-1).cpu()


def test_cpu_batch_gives_cpu_log_probs_equal_to_hf(worker, tiny_model_dir):
    batch = make_batch(len(worker.tokenizer))
    out = worker.compute_log_prob(_proto(batch))
    logp = out.batch[keys.OLD_LOG_PROBS]
    assert logp.device.type == "cpu" and out.batch[keys.ENTROPYS].device.type == "cpu"
    assert batch[keys.INPUT_IDS].device.type == "cpu"  # the caller's batch stays where it was
    mask = batch[keys.RESPONSE_MASK].bool()
    torch.testing.assert_close(logp[mask], _reference(tiny_model_dir, batch)[mask], atol=1e-4, rtol=1e-4)


def test_remove_padding_equals_padded_on_gpu(worker):
    batch = make_batch(len(worker.tokenizer), seed=3)
    worker.config = worker.config.replace(**{"rollout.log_prob_micro_batch_size_per_gpu": 8})  # 8 rows packed into one
    worker.actor.use_remove_padding = False
    padded = worker.compute_log_prob(_proto(batch))
    worker.actor.use_remove_padding = True
    try:
        packed = worker.compute_log_prob(_proto(batch))
    finally:
        worker.actor.use_remove_padding = False
    mask = batch[keys.RESPONSE_MASK].bool()
    for key in (keys.OLD_LOG_PROBS, keys.ENTROPYS):
        torch.testing.assert_close(packed.batch[key][mask], padded.batch[key][mask], atol=1e-4, rtol=1e-4)
