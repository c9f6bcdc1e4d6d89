"""The router aux loss of an MoE model whose config asks for it: the padded and the packed forward give the value
transformers computes on the padded batch, the actor adds coef x aux to its loss and logs it, and a model whose
config does not ask for it gets none."""

from __future__ import annotations

import pytest
import torch

from _batches import varied_batch
from _compose import SMALL, typed_config_of
from rlpost import keys
from rlpost.utils.moe_aux_loss import router_aux_loss
from rlpost.utils.tiny_families import family_model

pytestmark = pytest.mark.timeout(120)
VOCAB = 96


def _model(**overrides):
    return family_model("qwen3_moe", VOCAB, output_router_logits=True, router_aux_loss_coef=0.25, **overrides)


def test_packed_and_padded_forwards_give_transformers_aux_loss():
    from rlpost.engine.packed_attention import use_packed_attention
    from rlpost.workers.actor import forward_response_logits, token_logp_entropy

    batch = varied_batch(VOCAB)
    model = _model()
    want = model(input_ids=batch[keys.INPUT_IDS], attention_mask=batch[keys.ATTENTION_MASK],
                 position_ids=batch[keys.POSITION_IDS]).aux_loss
    collector = router_aux_loss(model)
    assert collector is not None and collector.coef == 0.25
    collector.take()  # the reference call above
    fn = lambda lg, lb: token_logp_entropy(lg, lb)  # noqa: E731
    forward_response_logits(model, batch, False, fn)
    padded = collector.take()
    use_packed_attention(model)
    forward_response_logits(model, batch, True, fn)
    packed = collector.take()
    torch.testing.assert_close(padded, want.float(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(packed, want.float(), atol=1e-6, rtol=1e-6)  # the same real tokens
    with torch.no_grad():  # the log-prob pass builds no graph: nothing to add
        forward_response_logits(model, batch, True, fn)
    assert collector.take() is None


def test_the_actor_adds_coef_times_aux_and_logs_it():
    from rlpost.workers.actor import DataParallelPPOActor

    cfg = typed_config_of(*SMALL).actor_rollout_ref.actor
    batch = varied_batch(VOCAB)
    batch.update({keys.OLD_LOG_PROBS: torch.zeros(batch[keys.RESPONSES].shape),
                  keys.ADVANTAGES: torch.zeros(batch[keys.RESPONSES].shape)})  # zero advantages: pg loss 0
    model = _model()
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), use_remove_padding=False)
    loss, metrics = actor._micro_loss(batch, 1.0)
    aux = metrics["actor/moe_aux_loss"]
    assert float(aux) > 0
    assert cfg.entropy_coeff == 0 and not cfg.use_kl_loss  # the loss is the pg loss plus the aux term alone
    torch.testing.assert_close(loss, metrics["actor/pg_loss"] + 0.25 * aux, atol=1e-6, rtol=1e-6)
    dense = family_model("qwen3_moe", VOCAB)  # output_router_logits false (the released configs' default)
    assert router_aux_loss(dense) is None
    assert "actor/moe_aux_loss" not in DataParallelPPOActor(cfg, dense, torch.optim.SGD(dense.parameters(), lr=0.0)
                                                            )._micro_loss(batch, 1.0)[1]
