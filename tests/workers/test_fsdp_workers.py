"""ActorRolloutRefWorker / CriticWorker on 2 gloo ranks (CPU, tiny model), grouped in one spawned run.

Configs are composed from ppo_trainer.yaml; the actor worker gets the DictConfig group, the offloaded actor
and the critic get the typed dataclasses, so both forms the trainer may pass are exercised."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch

from rlpost import keys
from _fsdp_helpers import arr_config, make_batch, spawn, typed_full_config
from _fsdp_helpers import gather_all as _gather
from _fsdp_helpers import shard_of as _proto

pytestmark = pytest.mark.timeout(280)


class RecordingRollout:
    """Stands in for vLLM: records what the worker streams and how it drives the engine. Sleeps like
    vLLM's level 2 with an actor present: the weights are dropped (`needs_sync`) until the next sync."""

    def __init__(self, config, model_path, tokenizer, device, module=None) -> None:
        self.received: list[tuple[str, tuple, torch.dtype]] = []
        self.last_values: dict[str, torch.Tensor] = {}
        self.calls: list[str] = []
        self.needs_sync = False

    def update_weights(self, named_tensors) -> None:
        self.calls.append("update_weights")
        self.needs_sync = False
        for name, t in named_tensors:
            self.received.append((name, tuple(t.shape), t.dtype))
            self.last_values[name] = t.detach().clone()

    def generate_sequences(self, prompts):
        assert not self.needs_sync, "generation on dropped weights"
        self.calls.append("generate_sequences")
        return prompts

    def sleep(self) -> None:
        self.calls.append("sleep")
        self.needs_sync = True

    def wake_up(self) -> None:
        self.calls.append("wake_up")


def _logp(worker, batch, rank, world, **meta):
    data = _proto(batch, rank, world)
    out = worker.compute_log_prob(data)
    return _gather(out.batch[keys.OLD_LOG_PROBS]), _gather(out.batch[keys.ENTROPYS])


def _actor_checks(rank: int, world: int, model_dir: str, tmp: str, res: dict) -> None:
    from rlpost.rollout import ROLLOUT_REGISTRY
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    if "recording" not in ROLLOUT_REGISTRY:
        ROLLOUT_REGISTRY.register("recording")(RecordingRollout)
    cfg = arr_config(model_dir, rollout="recording")
    w = ActorRolloutRefWorker(cfg, role="actor_rollout_ref")
    w.init_model(total_training_steps=10)
    batch = make_batch(len(w.tokenizer))
    res["batch"] = batch
    res["mini_rows"] = (w.mini_batch_rows, w.actor.mini_batch_rows)
    res["mini_prompts"] = w.config.actor.ppo_mini_batch_size  # the config itself is never rewritten
    res["sync_at_init"] = list(w.rollout.received)
    res["values_at_init"] = dict(w.rollout.last_values)
    res["calls_at_init"] = list(w.rollout.calls)
    w.rollout.calls.clear()
    w.generate_sequences(_proto(batch, rank, world))  # e.g. validation before the first update
    res["calls_at_first_generate"] = list(w.rollout.calls)
    w.rollout.received.clear()
    res["logp"], res["ent"] = _logp(w, batch, rank, world)
    w.config = w.config.replace(**{"rollout.log_prob_use_dynamic_bsz": True})
    res["logp_dyn"], _ = _logp(w, batch, rank, world)
    w.config = w.config.replace(**{"rollout.log_prob_use_dynamic_bsz": False})
    w.actor.use_remove_padding = True
    res["logp_rmpad"], _ = _logp(w, batch, rank, world)
    w.actor.use_remove_padding = False
    res["ref"] = _gather(w.compute_ref_log_prob(_proto(batch, rank, world)).batch[keys.REF_LOG_PROB])

    ckpt = f"{tmp}/ckpt"
    w.save_checkpoint(ckpt, global_step=1)
    adv = torch.ones(8, 5)
    extra = {keys.OLD_LOG_PROBS: res["logp"], keys.ADVANTAGES: adv}
    w.rollout.received.clear()
    out = w.update_actor(_proto(batch, rank, world, **extra))
    res["metrics"] = out.meta_info[keys.META_METRICS]
    res["sync_after_update"] = list(w.rollout.received)
    res["logp_after_a"], _ = _logp(w, batch, rank, world)
    res["lr_after"] = w.actor_lr_scheduler.get_last_lr()[0]

    # Reload and redo the update with a different micro-batch split: same result expected.
    w.load_checkpoint(ckpt)
    res["logp_reloaded"], _ = _logp(w, batch, rank, world)
    w.actor.config = w.actor.config.replace(ppo_micro_batch_size_per_gpu=1)
    w.update_actor(_proto(batch, rank, world, **extra))
    res["logp_after_b"], _ = _logp(w, batch, rank, world)
    w.load_checkpoint(ckpt)
    w.actor.config = w.actor.config.replace(use_dynamic_bsz=True)
    w.update_actor(_proto(batch, rank, world, **extra))
    res["logp_after_dyn"], _ = _logp(w, batch, rank, world)

    # Round trip with optimiser state: a second step after reloading equals the second step before.
    ckpt2 = f"{tmp}/ckpt2"
    w.save_checkpoint(ckpt2, global_step=2, max_ckpt_to_keep=1)
    res["first_ckpt_pruned"] = not os.path.exists(ckpt)
    w.update_actor(_proto(batch, rank, world, **extra))
    res["logp_second"], _ = _logp(w, batch, rank, world)
    w.load_checkpoint(ckpt2)
    res["optim_state_after_load"] = len(w.actor_optimizer.state)
    w.update_actor(_proto(batch, rank, world, **extra))
    res["logp_second_reloaded"], _ = _logp(w, batch, rank, world)
    w.save_checkpoint(f"{tmp}/hf", save_contents=("hf_model",))
    res["hf_dir"] = f"{tmp}/hf/huggingface"


def _offload_and_critic(rank: int, world: int, model_dir: str, tmp: str, res: dict) -> None:
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    typed = typed_full_config(model_dir, "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
                              "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                              "critic.optim.lr_scheduler=cosine")
    w = ActorRolloutRefWorker(typed.actor_rollout_ref, role="actor")
    w.init_model(total_training_steps=10)
    batch = res["batch"]
    extra = {keys.OLD_LOG_PROBS: res["logp"], keys.ADVANTAGES: torch.ones(8, 5)}
    w.update_actor(_proto(batch, rank, world, **extra))
    res["logp_after_offload"], _ = _logp(w, batch, rank, world)

    c = CriticWorker(typed.critic)
    res["critic_mini_rows"] = c.mini_batch_rows
    c.init_model(total_training_steps=4)  # the schedule spans these steps, not optim.total_training_steps=-1
    res["critic_lrs"] = []
    values = _gather(c.compute_values(_proto(batch, rank, world)).batch[keys.VALUES])
    res["values"] = values
    returns = torch.linspace(-1, 1, 40).reshape(8, 5)
    data = {keys.VALUES: values, keys.RETURNS: returns}
    losses = []
    for _ in range(4):
        out = c.update_critic(_proto(batch, rank, world, **data))
        losses.append(out.meta_info[keys.META_METRICS]["critic/vf_loss"][0])
        res["critic_lrs"].append(out.meta_info[keys.META_METRICS]["critic/lr"])
    res["vf_losses"] = losses
    res["critic_metrics"] = sorted(out.meta_info[keys.META_METRICS])


def _run(rank: int, model_dir: str, tmp: str) -> None:
    torch.manual_seed(0)
    res: dict = {}
    t0 = time.perf_counter()
    _actor_checks(rank, 2, model_dir, tmp, res)
    t1 = time.perf_counter()
    _offload_and_critic(rank, 2, model_dir, tmp, res)
    res["phase_s"] = (t1 - t0, time.perf_counter() - t1)
    if rank == 0:
        torch.save(res, f"{tmp}/res.pt")


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fsdp2"))
    spawn(_run, (tiny_model_dir, tmp), tmp)
    return torch.load(f"{tmp}/res.pt", weights_only=False)


def _reference_logp(model_dir: str, batch: dict, temperature: float) -> torch.Tensor:
    """Plain single-process HF forward: log p(response | prefix) at logits / temperature."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = model(input_ids=batch[keys.INPUT_IDS], attention_mask=batch[keys.ATTENTION_MASK],
                position_ids=batch[keys.POSITION_IDS])
    logits = out.logits[:, -6:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch[keys.RESPONSES].unsqueeze(-1)).squeeze(-1)


def test_log_probs_match_single_process_and_all_paths(results, tiny_model_dir):
    mask = results["batch"][keys.RESPONSE_MASK].bool()
    ref = _reference_logp(tiny_model_dir, results["batch"], 0.7).detach()
    assert results["logp"].shape == (8, 5)
    torch.testing.assert_close(results["logp"][mask], ref[mask], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(results["logp_dyn"], results["logp"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results["logp_rmpad"][mask], results["logp"][mask], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(results["ref"], results["logp"], atol=1e-5, rtol=1e-5)
    assert (results["ent"][mask] > 0).all()


def test_update_raises_logp_and_is_independent_of_micro_batching(results):
    mask = results["batch"][keys.RESPONSE_MASK].bool()
    before, after = results["logp"][mask], results["logp_after_a"][mask]
    assert after.mean() > before.mean() + 1e-3
    torch.testing.assert_close(results["logp_reloaded"], results["logp"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results["logp_after_b"], results["logp_after_a"], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(results["logp_after_dyn"], results["logp_after_a"], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(results["logp_after_offload"], results["logp_after_a"], atol=2e-5, rtol=2e-5)
    assert results["optim_state_after_load"] > 0
    assert results["first_ckpt_pruned"]
    torch.testing.assert_close(results["logp_second_reloaded"], results["logp_second"], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(results["logp_second"], results["logp_after_dyn"])


def test_hf_model_export_holds_trained_weights(results):
    mask = results["batch"][keys.RESPONSE_MASK].bool()
    exported = _reference_logp(results["hf_dir"], results["batch"], 0.7).detach()
    torch.testing.assert_close(exported[mask], results["logp_second_reloaded"][mask], atol=1e-4, rtol=1e-4)


def test_metrics_and_batch_normalisation(results):
    m = results["metrics"]
    assert results["mini_rows"] == (2, 2)  # 4 prompts x n=1 over 2 ranks, handed to the actor
    assert results["mini_prompts"] == 4 and results["critic_mini_rows"] == 4  # critic: 8 prompts over 2 ranks
    for name in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower",
                 "actor/grad_norm", "actor/lr", "timing_s/update_actor", "timing_s/update_weights"):
        assert name in m, name
    assert len(m["actor/grad_norm"]) == 2  # 2 mini-batches on this rank
    assert m["actor/lr"] == pytest.approx(1e-2)
    # first mini-batch: ratio == 1, so pg_loss == -mean(advantage) == -1
    assert abs(m["actor/pg_loss"][0] + 1.0) < 1e-5


def test_weight_sync_streams_full_tensors_in_rollout_dtype(results, tiny_model_dir):
    sync = results["sync_at_init"]
    names = [n for n, _, _ in sync]
    assert "model.layers.0.self_attn.q_proj.weight" in names
    shapes = dict((n, s) for n, s, _ in sync)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (128, 128)  # full, not a shard
    assert {d for _, _, d in sync} == {torch.bfloat16}
    # values: each shard is cast to bf16 and then gathered (one all-gather per bucket of
    # rollout.update_weights_bucket_megabytes, tests/engine/test_fsdp_gather.py); that equals the HF weights in bf16
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    values = results["values_at_init"]
    assert len(values) == len(names) and set(values) <= set(hf)
    for name, t in values.items():
        assert torch.equal(t, hf[name].to(torch.bfloat16)), name
    assert results["calls_at_init"] == ["update_weights", "sleep"]
    # the sleep dropped the weights: the first generation re-syncs them first
    assert results["calls_at_first_generate"] == ["update_weights", "wake_up", "generate_sequences", "sleep"]
    assert [n for n, _, _ in results["sync_after_update"]] == names


def test_critic_values_and_update(results):
    assert results["values"].shape == (8, 5)
    losses = results["vf_losses"]
    assert losses[-1] < losses[0]
    # cosine over the 4 explicit steps after 1 warmup step: 0, then 1e-3 * (1 + cos(pi * k / 3)) / 2
    expected = [0.0] + [1e-3 * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(3)]
    assert results["critic_lrs"] == pytest.approx(expected)
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
            "critic/lr"} <= set(results["critic_metrics"])
