"""Ulysses sequence parallelism on gloo ranks: log-probs, entropy and gradients with SP > 1 equal SP = 1's on the
same batch (float32, CPU: atol 1e-5 on values, 1e-5 relative on gradients), for GQA models with fewer KV heads
than the SP size, with gradient checkpointing, for the critic's value loss, and through the FSDP2 workers (actor,
reference, critic)."""

from __future__ import annotations

import pytest
import torch

from _fsdp_helpers import arr_config, full_config, gather_all, make_batch, shard_of, spawn
from rlpost import keys

pytestmark = pytest.mark.timeout(300)

VOCAB = 96


def _model(heads: int, kv_heads: int, checkpointing: bool):
    """A 2-layer Qwen2 (head_dim 16), the same weights on every rank, SDPA attention."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=16 * heads, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    model.set_attn_implementation("sdpa")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _values_and_grads(model, batch, sp):
    """Per-token (log-prob, entropy) (B, R, 2) of the responses and the gradient of a weighted sum of them."""
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    model.zero_grad(set_to_none=True)
    both = forward_response_logits(model, batch, True, lambda lg, lb: token_logp_entropy(lg, lb, 0.7, True), sp)
    weights = torch.linspace(-1.0, 1.0, both.numel()).reshape(both.shape) * batch[keys.RESPONSE_MASK][..., None]
    (both * weights).sum().backward()
    return both.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _long_prompt_batch() -> dict[str, torch.Tensor]:
    """One row, 10 prompt and 2 response tokens: the first ranks' slices hold no response token at all."""
    ids = torch.arange(3, 15)[None]
    ones = torch.ones_like(ids)
    return {keys.INPUT_IDS: ids, keys.ATTENTION_MASK: ones, keys.POSITION_IDS: torch.arange(12)[None],
            keys.RESPONSES: ids[:, -2:], keys.RESPONSE_MASK: ones[:, -2:]}


def _forward_backward(rank: int, cases: list[tuple[int, int, int, bool]]) -> None:
    """Each case (heads, kv_heads, SP size, gradient checkpointing): SP values equal the single-rank ones, and
    the SP group's gradients, averaged as FSDP averages them, equal the single-rank gradients."""
    import torch.distributed as dist

    from rlpost.utils.distributed import init_distributed
    from rlpost.engine.ulysses import new_sequence_parallel, use_ulysses_attention

    init_distributed("cpu")
    for heads, kv_heads, size, checkpointing in cases:
        sp = new_sequence_parallel(size)
        model = _model(heads, kv_heads, checkpointing)
        for batch in (make_batch(VOCAB), _long_prompt_batch()):
            model.set_attn_implementation("sdpa")
            want, want_grads = _values_and_grads(model, batch, None)
            use_ulysses_attention(model, sp.size)
            got, grads = _values_and_grads(model, batch, sp)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            for name, grad in grads.items():
                dist.all_reduce(grad, group=sp.group)
                # float32 sums in another order (all-to-all slices): 1e-5 of the tensor's largest entry
                tol = 1e-5 * float(want_grads[name].abs().max())
                torch.testing.assert_close(grad / size, want_grads[name], atol=tol, rtol=1e-5,
                                           msg=lambda m, n=name: f"{n}: {m}")


def _masked(t: torch.Tensor, batch: dict) -> torch.Tensor:
    """Values on response tokens only: the position after a sequence's last token predicts whatever the packing
    put next, which differs between micro-batch splits and is never used."""
    return t * batch[keys.RESPONSE_MASK]


def _prompts(batch: dict, rank: int):
    """This rank's left-padded prompts, for greedy generation."""
    mask = batch[keys.ATTENTION_MASK][:, :batch[keys.PROMPTS].shape[1]]
    prompts = {keys.INPUT_IDS: batch[keys.PROMPTS], keys.ATTENTION_MASK: mask,
               keys.POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0)}
    data = shard_of(prompts, rank, 2)
    data.meta_info.update({keys.META_DO_SAMPLE: False, keys.META_VALIDATE: False})
    return data


def _actor_results(rank: int, model_dir: str, size: int) -> dict[str, torch.Tensor]:
    """What the trainer gets from an actor_rollout_ref worker (Ulysses size `size` for actor and reference):
    log-probs, entropies (fixed and dynamic micro-batches), reference log-probs, greedy HF generation on the
    actor's (patched) module, the grad norm of one update on all 8 rows and the log-probs after it."""
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = arr_config(model_dir, "actor_rollout_ref.model.use_remove_padding=true",
                     "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                     f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={size}",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.use_kl_loss=true",
                     "actor_rollout_ref.actor.entropy_coeff=0.01")
    w = ActorRolloutRefWorker(cfg, role="actor_rollout_ref")
    w.init_model(total_training_steps=2)
    batch = make_batch(len(w.tokenizer))
    out = w.compute_log_prob(shard_of(batch, rank, 2))
    res = {"logp": gather_all(out.batch[keys.OLD_LOG_PROBS]), "ent": gather_all(out.batch[keys.ENTROPYS])}
    w.config = w.config.replace(**{"rollout.log_prob_use_dynamic_bsz": True})
    res["logp_dyn"] = gather_all(w.compute_log_prob(shard_of(batch, rank, 2)).batch[keys.OLD_LOG_PROBS])
    res["ref"] = gather_all(w.compute_ref_log_prob(shard_of(batch, rank, 2)).batch[keys.REF_LOG_PROB])
    res["generated"] = gather_all(w.generate_sequences(_prompts(batch, rank)).batch[keys.RESPONSES])
    extra = {keys.OLD_LOG_PROBS: res["logp"], keys.REF_LOG_PROB: res["ref"] - 0.1,
             keys.ADVANTAGES: torch.linspace(-1, 1, 40).reshape(8, 5)}
    metrics = w.update_actor(shard_of(batch, rank, 2, **extra)).meta_info[keys.META_METRICS]
    res["grad_norm"] = torch.tensor(metrics["actor/grad_norm"])
    res["logp_after"] = gather_all(w.compute_log_prob(shard_of(batch, rank, 2)).batch[keys.OLD_LOG_PROBS])
    return {k: v if k in ("generated", "grad_norm") else _masked(v, batch) for k, v in res.items()}


def _critic_results(rank: int, model_dir: str, size: int) -> dict[str, torch.Tensor]:
    """Values before and after one critic update on all 8 rows, and its grad norm (Ulysses size `size`)."""
    from rlpost.workers.fsdp_workers import CriticWorker

    cfg = full_config(model_dir, f"critic.ulysses_sequence_parallel_size={size}", "critic.enable=true",
                      "critic.optim.lr_warmup_steps=0").critic
    w = CriticWorker(cfg)
    torch.manual_seed(0)  # the value head is freshly initialised: the same head for both sizes
    w.init_model(total_training_steps=2)
    batch = make_batch(len(w.tokenizer))
    res = {"values": gather_all(w.compute_values(shard_of(batch, rank, 2)).batch[keys.VALUES])}
    extra = {keys.VALUES: res["values"], keys.RETURNS: torch.linspace(-1, 1, 40).reshape(8, 5)}
    metrics = w.update_critic(shard_of(batch, rank, 2, **extra)).meta_info[keys.META_METRICS]
    res["grad_norm"] = torch.tensor(metrics["critic/grad_norm"])
    res["values_after"] = gather_all(w.compute_values(shard_of(batch, rank, 2)).batch[keys.VALUES])
    return res


def _value_loss_gradients(model_dir: str) -> None:
    """The critic's clipped value loss on a 4-head / 2-KV-head token-classification model: values, loss and every
    parameter's gradient (the SP group's summed as FSDP averages them) with SP 2 equal one rank's."""
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    from rlpost.engine.packed_attention import use_packed_attention
    from rlpost.engine.ulysses import new_sequence_parallel, use_ulysses_attention
    from rlpost.workers.critic import DataParallelPPOCritic

    cfg = full_config(model_dir, "critic.enable=true", "critic.cliprange_value=0.2").critic
    sp = new_sequence_parallel(2)
    torch.manual_seed(0)
    model = Qwen2ForTokenClassification(Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_labels=1, classifier_dropout=0.0)).train()
    batch = make_batch(VOCAB)
    batch[keys.VALUES] = torch.linspace(0.3, -0.3, 40).reshape(8, 5)  # some clipped, some not
    batch[keys.RETURNS] = torch.linspace(-1.0, 1.0, 40).reshape(8, 5)
    results = []
    for group in (None, sp):
        if group is None:
            use_packed_attention(model)
        else:
            use_ulysses_attention(model, group.size)
        critic = DataParallelPPOCritic(cfg, model, None, True, 8, group)
        model.zero_grad(set_to_none=True)
        loss, metrics = critic._micro_loss(batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        for grad in grads.values() if group is not None else ():
            dist.all_reduce(grad, group=group.group)
            grad /= group.size
        with torch.no_grad():
            results.append((_masked(critic._values(batch), batch), loss.detach(), metrics["critic/vf_clipfrac"], grads))
    (want_v, want_loss, want_clip, want_grads), (got_v, got_loss, got_clip, got_grads) = results
    assert 0 < want_clip < 1  # both branches of the clip are exercised
    torch.testing.assert_close(got_v, want_v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-6, rtol=1e-5)
    for name, grad in got_grads.items():
        torch.testing.assert_close(grad, want_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def _shuffle_draws_agree(rank: int) -> None:
    """Ranks with different generator states draw the same numbers after `sync_rng` (a seedless shuffle)."""
    from rlpost.engine.ulysses import new_sequence_parallel, sync_rng

    torch.manual_seed(rank)
    sync_rng(new_sequence_parallel(2))
    draws = gather_all(torch.rand(4)).reshape(2, 4)
    assert torch.equal(draws[0], draws[1])


def _two_ranks(rank: int, model_dir: str) -> None:
    _forward_backward(rank, [(2, 1, 2, False), (4, 2, 2, True)])
    _value_loss_gradients(model_dir)
    _shuffle_draws_agree(rank)
    for results, before, after in ((_actor_results, "logp", "logp_after"), (_critic_results, "values", "values_after")):
        want, got = results(rank, model_dir, 1), results(rank, model_dir, 2)
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-4, msg=key)
        assert (got[after] - got[before]).abs().max() > 1e-3  # the update moved the model


def test_two_ranks_match_single_rank(tmp_path, tiny_model_dir):
    """The tiny model's layout (one KV head for two ranks), 4 heads / 2 KV heads with checkpointing, then the
    FSDP2 workers: actor and reference with SP 2 (data-parallel size 1) against SP 1 (data-parallel size 2) on
    the same 8 rows, through log-probs, an update (gradient accumulation over 2 micro-batches vs 1), generation;
    the critic's value loss and its per-parameter gradients; the critic worker likewise."""
    spawn(_two_ranks, (str(tiny_model_dir),), str(tmp_path), world=2)


def test_four_ranks_match_single_rank(tmp_path):
    """SP 4 with 1 and 2 KV heads (repeated to 4), and two SP groups of 2 (data-parallel size 2)."""
    spawn(_forward_backward, ([(4, 1, 4, False), (4, 2, 4, True), (4, 2, 2, False)],), str(tmp_path), world=4)
