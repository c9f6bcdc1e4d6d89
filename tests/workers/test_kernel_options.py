"""The speed/memory keys of the log-prob path on 2 gloo ranks (CPU, tiny model): packed attention
(use_remove_padding), the fused LM head (use_fused_kernels, impl_backend=triton), torch.compile (ref),
entropy_from_logits_with_chunking and entropy_checkpointing give the plain worker's log-probs, entropies,
reference log-probs and update."""

from __future__ import annotations

import pytest
import torch

from rlpost import keys
from _fsdp_helpers import arr_config, make_batch, spawn
from _fsdp_helpers import gather_all as _gather
from _fsdp_helpers import shard_of as _proto

# Two workers (actor + reference) on 2 ranks plus one inductor compile on CPU: 80-105 s with the 2 cores
# shared by other jobs (load average 5-7).
pytestmark = [pytest.mark.timeout(400), pytest.mark.e2e]
ARR = "actor_rollout_ref"
# lr 1e-4 (the worker tests' 1e-2 turns ~1e-7 relative gradient differences into ~1e-4 after a few AdamW
# steps: near-zero gradients flip the sign of their update)
COMMON = (f"{ARR}.actor.entropy_coeff=0.01", f"{ARR}.actor.use_kl_loss=true", f"{ARR}.actor.optim.lr=1e-4")
KERNELS = (f"{ARR}.model.use_remove_padding=true", f"{ARR}.model.use_fused_kernels=true",
           f"{ARR}.model.fused_kernel_options.impl_backend=triton", f"{ARR}.ref.use_torch_compile=true",
           f"{ARR}.actor.entropy_from_logits_with_chunking=true", f"{ARR}.actor.entropy_checkpointing=true",
           f"{ARR}.ref.entropy_from_logits_with_chunking=true",
           f"{ARR}.actor.fsdp_config.entropy_from_logits_chunk_size=16",  # verl's engine spelling: several chunks
           f"{ARR}.ref.fsdp_config.full_determinism=true", f"{ARR}.ref.fsdp_config.seed=7")


def _steps(w, rank: int, world: int, batch: dict, res: dict, unfuse_after_first: bool) -> None:
    """old_log_prob, ref, update, log-probs, update, log-probs; optionally the actor leaves the fused head after
    the first update, so the second update runs the chunked, checkpointed entropy path."""
    out = w.compute_log_prob(_proto(batch, rank, world))
    res["logp"], res["ent"] = _gather(out.batch[keys.OLD_LOG_PROBS]), _gather(out.batch[keys.ENTROPYS])
    res["ref"] = _gather(w.compute_ref_log_prob(_proto(batch, rank, world)).batch[keys.REF_LOG_PROB])
    extra = {keys.OLD_LOG_PROBS: res["logp"] - 0.05, keys.ADVANTAGES: torch.linspace(-1, 1, 40).reshape(8, 5),
             keys.REF_LOG_PROB: res["ref"]}
    for step in (1, 2):
        metrics = w.update_actor(_proto(batch, rank, world, **extra)).meta_info[keys.META_METRICS]
        res[f"metrics{step}"] = {k: metrics[k] for k in ("actor/pg_loss", "actor/entropy", "actor/kl_loss",
                                                         "actor/grad_norm")}
        if unfuse_after_first:
            w.actor.use_fused_kernels = False
        out = w.compute_log_prob(_proto(batch, rank, world))
        res[f"logp{step}"], res[f"ent{step}"] = (_gather(out.batch[keys.OLD_LOG_PROBS]),
                                                 _gather(out.batch[keys.ENTROPYS]))


def _run(rank: int, model_dir: str, tmp: str) -> None:
    from transformers import AutoTokenizer

    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    batch = make_batch(len(AutoTokenizer.from_pretrained(model_dir)))
    res = {"mask": batch[keys.RESPONSE_MASK].bool()}
    for name, overrides in (("plain", ()), ("kernels", KERNELS)):
        w = ActorRolloutRefWorker(arr_config(model_dir, *COMMON, *overrides), role="actor_rollout_ref")
        w.init_model(total_training_steps=4)
        res[name] = {"attn": w.actor_module.config._attn_implementation, "fused": w.actor.use_fused_kernels,
                     "chunk": w.actor._chunk, "ref_compiled": w.ref_policy._compile_fn.__name__,
                     "checkpoint": w.actor.config.entropy_checkpointing,
                     "deterministic": torch.are_deterministic_algorithms_enabled()}
        _steps(w, rank, 2, batch, res[name], unfuse_after_first=name == "kernels")
    if rank == 0:
        torch.save(res, f"{tmp}/res.pt")


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("kernels"))
    spawn(_run, (tiny_model_dir, tmp), tmp)
    return torch.load(f"{tmp}/res.pt", weights_only=False)


def test_options_reach_the_actor_and_reference(results):
    plain, kern = results["plain"], results["kernels"]
    assert plain["attn"] == "sdpa" and not plain["fused"] and plain["ref_compiled"] == "eager"
    assert kern["attn"] == "rlpost_packed" and kern["fused"] and kern["ref_compiled"] == "compiled"
    assert kern["chunk"] == 16 and plain["chunk"] == 4096 and kern["checkpoint"] and not plain["checkpoint"]
    assert kern["deterministic"] and not plain["deterministic"]  # the reference's full_determinism, process-wide


def test_kernel_paths_give_the_plain_log_probs_and_updates(results):
    """Fused head (actor and compiled reference) through update 1, then the unfused chunked/checkpointed path
    through update 2: every value matches the plain worker's."""
    mask, plain, kern = results["mask"], results["plain"], results["kernels"]
    for key in ("logp", "ent", "ref", "logp1", "ent1", "logp2", "ent2"):
        torch.testing.assert_close(kern[key][mask], plain[key][mask], atol=5e-5, rtol=1e-4, msg=key)
    for step in (1, 2):
        for name, values in plain[f"metrics{step}"].items():
            first = 1e-5 if step == 1 else 1e-3  # mini-batch 1 of update 1 runs from the same weights
            torch.testing.assert_close(kern[f"metrics{step}"][name][0], values[0], atol=1e-5, rtol=first, msg=name)
            torch.testing.assert_close(kern[f"metrics{step}"][name][1], values[1], atol=1e-5, rtol=1e-3, msg=name)
    assert (plain["logp2"][mask] - plain["logp"][mask]).abs().max() > 1e-4  # the updates moved the policy
