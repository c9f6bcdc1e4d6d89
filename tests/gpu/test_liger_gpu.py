"""On one GPU, bf16: `actor_rollout_ref.model.use_liger=true` puts Liger's Triton kernels (RMSNorm, RoPE, SwiGLU)
into the actor the worker builds (load, then FSDP2 over nccl). Its log-probs and entropies equal those of the
same weights without Liger to bf16 tolerance, padded and packed (remove-padding restarts the RoPE positions in
each sequence), and one PPO step through Liger's backward lands where the plain step does (0.5B-shaped layers, 2 of
them)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from rlpost import keys
from rlpost.utils.distributed import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))
from _fsdp_helpers import arr_config, make_batch  # noqa: E402

pytest.importorskip("liger_kernel.transformers.monkey_patch")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.fixture
def one_rank(monkeypatch, restore_qwen2):
    """Rank 0 of 1 over nccl, with transformers' qwen2 names restored afterwards."""
    import torch.distributed as dist

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "RLPOST_DEVICE": "cuda"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _worker(model_dir: str, use_liger: bool, rmpad: bool):
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = arr_config(model_dir, "trainer.device=cuda", "trainer.n_gpus_per_node=1",
                     "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
                     f"actor_rollout_ref.model.use_liger={str(use_liger).lower()}",
                     f"actor_rollout_ref.model.use_remove_padding={str(rmpad).lower()}",
                     "actor_rollout_ref.actor.optim.lr=1e-4")
    worker = ActorRolloutRefWorker(cfg, role="actor")
    worker.init_model()
    return worker


def _proto(batch: dict, **extra):
    from rlpost.protocol import DataProto

    return DataProto.from_dict(tensors={**batch, **extra}, meta_info={keys.META_TEMPERATURE: 0.7})


def _update(worker, batch: dict, logp: torch.Tensor) -> torch.Tensor:
    """One PPO step on `batch` with every advantage +1 (on-policy: old log-probs = `logp`); the log-probs after."""
    update = worker.update_actor(_proto(batch, **{keys.OLD_LOG_PROBS: logp, keys.ADVANTAGES: torch.ones_like(logp)}))
    metrics = update.meta_info[keys.META_METRICS]
    for name in ("actor/pg_loss", "actor/grad_norm"):
        values = metrics[name] if isinstance(metrics[name], list) else [metrics[name]]
        assert values and all(math.isfinite(float(v)) for v in values), (name, values)
    return worker.compute_log_prob(_proto(batch)).batch[keys.OLD_LOG_PROBS]


@pytest.mark.parametrize("rmpad", [False, True], ids=["padded", "packed"])
def test_liger_log_probs_match_and_update_runs(qwen05b_layers_dir, one_rank, rmpad):
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    plain = _worker(qwen05b_layers_dir, False, rmpad)  # first: once Liger is in, new qwen2 models in this process use it
    batch = make_batch(len(plain.tokenizer), seed=1)
    mask = batch[keys.RESPONSE_MASK].bool()
    ref = plain.compute_log_prob(_proto(batch)).batch
    assert plain.actor_module.model.norm.forward.__func__ is not LigerRMSNorm.forward
    plain_after = _update(plain, batch, ref[keys.OLD_LOG_PROBS])
    del plain
    torch.cuda.empty_cache()

    worker = _worker(qwen05b_layers_dir, True, rmpad)
    layer = worker.actor_module.model.layers[0]
    assert layer.input_layernorm.forward.__func__ is LigerRMSNorm.forward
    assert layer.mlp.forward.__func__ is LigerSwiGLUMLP.forward
    out = worker.compute_log_prob(_proto(batch)).batch
    for key in (keys.OLD_LOG_PROBS, keys.ENTROPYS):
        torch.testing.assert_close(out[key][mask], ref[key][mask], atol=5e-2, rtol=2e-2)
    # the same step through Liger's backward lands where the plain step did, and both raise the log-probs of
    # the responses they trained on (advantages +1, lr 1e-4)
    after = _update(worker, batch, out[keys.OLD_LOG_PROBS])
    # Adam's first step scales every gradient to ~lr, bf16 noise included: 1e-1 (H100: 0.067 at most, packed)
    torch.testing.assert_close(after[mask], plain_after[mask], atol=1e-1, rtol=2e-2)
    for before, later in ((ref[keys.OLD_LOG_PROBS], plain_after), (out[keys.OLD_LOG_PROBS], after)):
        assert later[mask].mean() > before[mask].mean(), (later[mask].mean(), before[mask].mean())
