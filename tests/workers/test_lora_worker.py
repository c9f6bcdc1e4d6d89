"""LoRA actor on 2 gloo ranks with the real vLLM CPU engine: only adapters train, the reference is the base
model (adapters off), the engine generates what the PEFT model generates after each sync (adapter served by
vLLM, and adapter merged into full weights), and checkpoints hold the adapter in PEFT's layout."""

from __future__ import annotations

import os

import pytest
import torch

from rlpost import keys
from _fsdp_helpers import arr_config, gather_all, make_batch, shard_of, spawn

pytestmark = pytest.mark.timeout(400)

LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.load_format=dummy_dtensor", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.free_cache_engine=false")


def _prompts(batch: dict) -> dict:
    ids = batch[keys.PROMPTS]
    mask = (ids != 0).long()
    return {keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask, keys.POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0)}


def _greedy(w, batch, rank, world) -> torch.Tensor:
    data = shard_of(_prompts(batch), rank, world)
    data.meta_info[keys.META_DO_SAMPLE] = False
    return gather_all(w.generate_sequences(data).batch[keys.RESPONSES])


def _frozen_and_trainable(module) -> tuple[dict, dict]:
    from torch.distributed.tensor import DTensor

    frozen, train = {}, {}
    for name, p in module.named_parameters():
        local = (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
        (train if p.requires_grad else frozen)[name] = local
    return frozen, train


def _run(rank: int, model_dir: str, tmp: str) -> None:
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    torch.manual_seed(0)
    world, res = 2, {}
    w = ActorRolloutRefWorker(arr_config(model_dir, *LORA, rollout="vllm"), role="actor_rollout_ref")
    w.init_model(total_training_steps=10)
    batch = make_batch(len(w.tokenizer))
    res["batch"], res["ref_is_actor"] = batch, w.ref_part.module is w.actor_module and w.ref_part.peft is None
    res["optim_params"] = sum(p.numel() for g in w.actor_optimizer.param_groups for p in g["params"])
    res["all_params"] = sum(p.numel() for p in w.actor_module.parameters())
    frozen0, train0 = _frozen_and_trainable(w.actor_module)
    extra = {keys.OLD_LOG_PROBS: torch.zeros(8, 5), keys.REF_LOG_PROB: torch.zeros(8, 5),
             keys.ADVANTAGES: torch.linspace(-1, 1, 8)[:, None].expand(8, 5).contiguous()}
    for _ in range(2):
        w.update_actor(shard_of(batch, rank, world, **extra))
    frozen1, train1 = _frozen_and_trainable(w.actor_module)
    res["frozen_same"] = all(torch.equal(frozen0[k], frozen1[k]) for k in frozen0)
    res["trainable_changed"] = sum(not torch.equal(train0[k], train1[k]) for k in train0) / len(train0)
    res["ref"] = gather_all(w.compute_ref_log_prob(shard_of(batch, rank, world)).batch[keys.REF_LOG_PROB])
    res["logp"] = gather_all(w.compute_log_prob(shard_of(batch, rank, world)).batch[keys.OLD_LOG_PROBS])
    res["engine_greedy"] = _greedy(w, batch, rank, world)
    w.actor.use_remove_padding = True  # packed rows through the LoRA layers
    res["logp_rmpad"] = gather_all(w.compute_log_prob(shard_of(batch, rank, world)).batch[keys.OLD_LOG_PROBS])
    w.actor.use_remove_padding = False
    w.config = w.config.replace(**{"rollout.log_prob_use_dynamic_bsz": True})  # token-budget micro-batches
    res["logp_dyn"] = gather_all(w.compute_log_prob(shard_of(batch, rank, world)).batch[keys.OLD_LOG_PROBS])
    w.config = w.config.replace(**{"rollout.log_prob_use_dynamic_bsz": False})

    w.save_checkpoint(f"{tmp}/ckpt", global_step=2)
    res["shard_keys"] = sorted(torch.load(f"{tmp}/ckpt/model_world_size_2_rank_{rank}.pt", weights_only=False))
    w.update_actor(shard_of(batch, rank, world, **extra))
    w.load_checkpoint(f"{tmp}/ckpt")
    res["logp_reloaded"] = gather_all(w.compute_log_prob(shard_of(batch, rank, world)).batch[keys.OLD_LOG_PROBS])
    res["engine_greedy_reloaded"] = _greedy(w, batch, rank, world)
    w.save_checkpoint(f"{tmp}/hf", save_contents=("hf_model",))  # the merged model, as a HF folder
    if rank == 0:
        torch.save(res, f"{tmp}/res.pt")


def _run_merged(rank: int, model_dir: str, tmp: str) -> None:
    """merge=true from the adapter saved by `_run` (one rank), given as verl does: the path alone, the rank read
    from the adapter. The engine gets full merged weights and no LoRA slot."""
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    adapter = f"{tmp}/ckpt/lora_adapter"
    cfg = arr_config(model_dir, *[o for o in LORA if ".lora_rank=" not in o], "actor_rollout_ref.model.lora.merge=true",
                     f"actor_rollout_ref.model.lora_adapter_path={adapter}",
                     "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", rollout="vllm")
    w = ActorRolloutRefWorker(cfg, role="actor_rollout_ref")
    w.init_model(total_training_steps=10)
    batch = torch.load(f"{tmp}/res.pt", weights_only=False)["batch"]
    out = {"engine_greedy": _greedy(w, batch, rank, 1),
           "engine_lora": w.rollout.llm.llm_engine.vllm_config.lora_config is not None}
    extra = {keys.OLD_LOG_PROBS: torch.zeros(8, 5), keys.REF_LOG_PROB: torch.zeros(8, 5),
             keys.ADVANTAGES: torch.linspace(-1, 1, 8)[:, None].expand(8, 5).contiguous()}
    before = w.compute_log_prob(shard_of(batch, rank, 1)).batch[keys.OLD_LOG_PROBS]
    out["offload_metrics"] = w.update_actor(shard_of(batch, rank, 1, **extra)).meta_info[keys.META_METRICS]
    out["offload_moved"] = (w.compute_log_prob(shard_of(batch, rank, 1)).batch[keys.OLD_LOG_PROBS] - before).abs().max()
    if rank == 0:
        torch.save(out, f"{tmp}/merged.pt")


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("lora"))
    spawn(_run, (tiny_model_dir, tmp), tmp)
    spawn(_run_merged, (tiny_model_dir, tmp), tmp, world=1)
    return tmp, torch.load(f"{tmp}/res.pt", weights_only=False), torch.load(f"{tmp}/merged.pt", weights_only=False)


def _peft_model(model_dir: str, adapter: str | None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return base if adapter is None else PeftModel.from_pretrained(base, adapter)


@torch.no_grad()
def _logp_of(model, batch: dict) -> torch.Tensor:
    out = model(input_ids=batch[keys.INPUT_IDS], attention_mask=batch[keys.ATTENTION_MASK],
                position_ids=batch[keys.POSITION_IDS])
    logits = out.logits[:, -6:-1].float() / 0.7
    return torch.log_softmax(logits, -1).gather(-1, batch[keys.RESPONSES].unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def _hf_greedy(model, batch: dict, steps: int) -> torch.Tensor:
    p = _prompts(batch)
    ids, mask = p[keys.INPUT_IDS], p[keys.ATTENTION_MASK]
    for _ in range(steps):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        nxt = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].argmax(-1, keepdim=True)
        ids, mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
    return ids[:, -steps:]


def test_only_adapters_train_and_base_stays_frozen(run):
    _, res, _ = run
    assert res["frozen_same"], "a frozen base weight changed"
    assert res["trainable_changed"] > 0.9
    assert res["optim_params"] < 0.2 * res["all_params"]  # only adapter parameters reach AdamW


def test_reference_is_the_base_model_and_no_second_model_is_loaded(run, tiny_model_dir):
    tmp, res, _ = run
    assert res["ref_is_actor"]  # the reference is the actor itself, viewed with its adapters off
    mask = res["batch"][keys.RESPONSE_MASK].bool()
    base = _logp_of(_peft_model(tiny_model_dir, None), res["batch"])
    torch.testing.assert_close(res["ref"][mask], base[mask], atol=2e-5, rtol=0)
    trained = _logp_of(_peft_model(tiny_model_dir, f"{tmp}/ckpt/lora_adapter"), res["batch"])
    torch.testing.assert_close(res["logp"][mask], trained[mask], atol=2e-5, rtol=0)
    assert (res["logp"][mask] - base[mask]).abs().max() > 1e-3  # the adapters did move the policy
    for other in ("logp_rmpad", "logp_dyn"):
        torch.testing.assert_close(res[other][mask], res["logp"][mask], atol=2e-5, rtol=0)


def test_engine_serves_the_trained_adapter_and_the_merged_weights(run, tiny_model_dir):
    tmp, res, merged = run
    want = _hf_greedy(_peft_model(tiny_model_dir, f"{tmp}/ckpt/lora_adapter"), res["batch"], 8)
    base = _hf_greedy(_peft_model(tiny_model_dir, None), res["batch"], 8)
    assert not torch.equal(want, base)  # the adapter changes greedy output: the comparison means something
    assert torch.equal(res["engine_greedy"], want)
    assert torch.equal(merged["engine_greedy"], want) and not merged["engine_lora"]


def test_offloaded_lora_actor_trains(run):
    _, _, merged = run  # param + optimizer offload, merged sync, started from a saved adapter
    assert all(v == v for k, v in merged["offload_metrics"].items() if isinstance(v, float))
    assert merged["offload_moved"] > 1e-4


def test_checkpoint_holds_adapter_in_peft_layout_and_resumes(run):
    tmp, res, _ = run
    assert res["shard_keys"] and all(".lora_" in k for k in res["shard_keys"])
    files = sorted(os.listdir(f"{tmp}/ckpt/lora_adapter"))
    assert files == ["adapter_config.json", "adapter_model.safetensors"]
    torch.testing.assert_close(res["logp_reloaded"], res["logp"], atol=1e-6, rtol=0)
    assert torch.equal(res["engine_greedy_reloaded"], res["engine_greedy"])


def test_hf_model_content_is_the_merged_model(run, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    tmp, res, _ = run
    merged = AutoModelForCausalLM.from_pretrained(f"{tmp}/hf/huggingface", dtype=torch.float32)
    want = _logp_of(_peft_model(tiny_model_dir, f"{tmp}/ckpt/lora_adapter"), res["batch"])
    torch.testing.assert_close(_logp_of(merged, res["batch"]), want, atol=2e-5, rtol=0)
