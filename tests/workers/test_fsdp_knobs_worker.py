"""FSDP engine knobs through `ActorRolloutRefWorker` on 2 gloo ranks: forward prefetch + activation offload
(with gradient checkpointing) give the baseline's log-probs and update; bf16 master weights
(`fsdp_config.model_dtype=bf16`) hold bf16 parameters and optimizer state and still train."""

from __future__ import annotations

import pytest
import torch

from rlpost import keys
from _fsdp_helpers import arr_config, make_batch, spawn
from _fsdp_helpers import gather_all as _gather
from _fsdp_helpers import shard_of as _proto

pytestmark = pytest.mark.timeout(240)
ARR = "actor_rollout_ref"


def _train_once(rank: int, model_dir: str, *overrides: str) -> dict:
    """Log-probs before and after one PPO update (advantages +1 on every token), the update's metrics."""
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    torch.manual_seed(0)
    w = ActorRolloutRefWorker(arr_config(model_dir, *overrides), role="actor")
    w.init_model(total_training_steps=10)
    batch = make_batch(len(w.tokenizer))
    before = _gather(w.compute_log_prob(_proto(batch, rank, 2)).batch[keys.OLD_LOG_PROBS])
    extra = {keys.OLD_LOG_PROBS: before, keys.ADVANTAGES: torch.ones(8, 5)}
    metrics = w.update_actor(_proto(batch, rank, 2, **extra)).meta_info[keys.META_METRICS]
    after = _gather(w.compute_log_prob(_proto(batch, rank, 2)).batch[keys.OLD_LOG_PROBS])
    local = next(iter(w.actor_module.parameters())).to_local()
    state = next(iter(w.actor_optimizer.state.values()))
    return {"before": before, "after": after, "pg_loss": metrics["actor/pg_loss"][0],
            "mask": batch[keys.RESPONSE_MASK], "param_dtype": local.dtype, "exp_avg_dtype": state["exp_avg"].dtype}


def _run(rank: int, model_dir: str, tmp: str) -> None:
    res = {
        "base": _train_once(rank, model_dir, f"{ARR}.model.enable_gradient_checkpointing=true"),
        "knobs": _train_once(rank, model_dir, f"{ARR}.model.enable_gradient_checkpointing=true",
                             f"{ARR}.actor.fsdp_config.forward_prefetch=true",
                             f"{ARR}.model.enable_activation_offload=true"),
        "bf16": _train_once(rank, model_dir, f"{ARR}.actor.fsdp_config.model_dtype=bf16"),
    }
    if rank == 0:
        torch.save(res, f"{tmp}/res.pt")


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("knobs"))
    spawn(_run, (tiny_model_dir, tmp), tmp)
    return torch.load(f"{tmp}/res.pt", weights_only=False)


def test_prefetch_and_activation_offload_keep_log_probs_and_update(results):
    base, knobs = results["base"], results["knobs"]
    assert torch.equal(base["before"], knobs["before"])
    torch.testing.assert_close(knobs["after"], base["after"], atol=1e-6, rtol=0)
    assert knobs["pg_loss"] == pytest.approx(base["pg_loss"], abs=1e-6)
    assert base["param_dtype"] == knobs["param_dtype"] == torch.float32


def test_bf16_master_weights_hold_bf16_and_still_train(results):
    base, bf16 = results["base"], results["bf16"]
    assert bf16["param_dtype"] == bf16["exp_avg_dtype"] == torch.bfloat16
    mask = bf16["mask"].bool()
    # bf16 weights: the log-probs are those of the rounded weights, close to the fp32 ones
    assert (bf16["before"] - base["before"])[mask].abs().max() < 0.05
    gain = (bf16["after"] - bf16["before"])[mask].mean()
    assert gain > 0.05  # advantages +1 everywhere: the update raised the log-probs (lr 1e-2)
    assert gain == pytest.approx((base["after"] - base["before"])[mask].mean().item(), rel=0.3)
