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

# Three workers (actor + reference) on 2 ranks plus one inductor compile on CPU: 173 s with the 2 cores shared
# (load average 10).
pytestmark = [pytest.mark.timeout(400), pytest.mark.e2e]
ARR = "actor_rollout_ref"
COMMON = (f"{ARR}.actor.entropy_coeff=0.01", f"{ARR}.actor.use_kl_loss=true")
VARIANTS = {
    "plain": (),
    "fused": (f"{ARR}.model.use_remove_padding=true", f"{ARR}.model.use_fused_kernels=true",
              f"{ARR}.model.fused_kernel_options.impl_backend=triton"),
    "chunked": (f"{ARR}.actor.entropy_from_logits_with_chunking=true", f"{ARR}.actor.entropy_checkpointing=true",
                f"{ARR}.ref.entropy_from_logits_with_chunking=true", f"{ARR}.ref.use_torch_compile=true"),
}


def _variant(rank: int, world: int, model_dir: str, overrides: tuple[str, ...], batch: dict) -> dict:
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    w = ActorRolloutRefWorker(arr_config(model_dir, *COMMON, *overrides), role="actor_rollout_ref")
    w.init_model(total_training_steps=4)
    res = {"attn": w.actor_module.config._attn_implementation, "fused": w.actor.use_fused_kernels,
           "chunk": w.actor._chunk, "ref_compiled": w.ref_policy._compile_fn.__name__}
    out = w.compute_log_prob(_proto(batch, rank, world))
    res["logp"], res["ent"] = _gather(out.batch[keys.OLD_LOG_PROBS]), _gather(out.batch[keys.ENTROPYS])
    res["ref"] = _gather(w.compute_ref_log_prob(_proto(batch, rank, world)).batch[keys.REF_LOG_PROB])
    extra = {keys.OLD_LOG_PROBS: res["logp"] - 0.05, keys.ADVANTAGES: torch.linspace(-1, 1, 40).reshape(8, 5),
             keys.REF_LOG_PROB: res["ref"]}
    metrics = w.update_actor(_proto(batch, rank, world, **extra)).meta_info[keys.META_METRICS]
    res["metrics"] = {k: metrics[k] for k in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm")}
    res["logp_after"] = _gather(w.compute_log_prob(_proto(batch, rank, world)).batch[keys.OLD_LOG_PROBS])
    return res


def _run(rank: int, model_dir: str, tmp: str) -> None:
    from transformers import AutoTokenizer

    batch = make_batch(len(AutoTokenizer.from_pretrained(model_dir)))
    res = {name: _variant(rank, 2, model_dir, overrides, batch) for name, overrides in VARIANTS.items()}
    res["mask"] = batch[keys.RESPONSE_MASK].bool()
    if rank == 0:
        torch.save(res, f"{tmp}/res.pt")


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("kernels"))
    spawn(_run, (tiny_model_dir, tmp), tmp)
    return torch.load(f"{tmp}/res.pt", weights_only=False)


def test_options_reach_the_actor_and_reference(results):
    assert results["plain"]["attn"] == "sdpa" and not results["plain"]["fused"]
    assert results["fused"]["attn"] == "rlpost_packed" and results["fused"]["fused"]
    assert results["chunked"]["ref_compiled"] == "compiled" and results["plain"]["ref_compiled"] == "eager"
    assert results["chunked"]["chunk"] < results["plain"]["chunk"]


@pytest.mark.parametrize("variant", ["fused", "chunked"])
def test_variant_gives_the_plain_log_probs_and_update(results, variant):
    mask, plain, got = results["mask"], results["plain"], results[variant]
    for key in ("logp", "ent", "ref", "logp_after"):
        torch.testing.assert_close(got[key][mask], plain[key][mask], atol=2e-5, rtol=1e-4, msg=key)
    for name, values in plain["metrics"].items():
        # mini-batch 1 from the same weights; mini-batch 2 after an AdamW step at lr 1e-2, which turns ~1e-7
        # relative gradient differences into ~1e-4 (near-zero gradients flip the sign of their update)
        torch.testing.assert_close(got["metrics"][name][0], values[0], atol=1e-5, rtol=1e-5, msg=name)
        torch.testing.assert_close(got["metrics"][name][1], values[1], atol=1e-5, rtol=1e-3, msg=name)
    assert (plain["logp_after"][mask] - plain["logp"][mask]).abs().max() > 1e-4  # the update moved the policy
