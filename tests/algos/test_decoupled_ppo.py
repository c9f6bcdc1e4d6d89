"""Decoupled PPO on a partial rollout, by hand: one sample whose first two tokens were sampled by policy
version 0 and the last two by version 1 (paused at a weight push, resumed with the new weights). The loss
takes its PPO ratio against the proximal policy (the actor's recomputed `old_log_probs`, version 1) and weights
each token by pi_prox / pi_behaviour of the version that sampled it (`algorithm.rollout_correction.rollout_is=
token`, truncated at 2): verl's rollout correction with `compute_prox_log_prob`."""

from types import SimpleNamespace

import pytest
import torch

from rlpost import algos as ca

pytestmark = pytest.mark.timeout(30)

CFG = SimpleNamespace(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=False,
                      rollout_rs=None, rollout_rs_threshold=None, bypass_mode=False, loss_type="ppo_clip")


def test_each_token_is_weighted_by_the_proximal_over_its_own_behaviour_policy():
    versions = torch.tensor([[0, 0, 1, 1, -1]])  # the last position is padding
    mask = (versions >= 0).float()
    prox = torch.log(torch.tensor([[0.2, 0.3, 0.4, 0.5, 1.0]]))  # pi_prox of each sampled token (version 1)
    by_version = {0: torch.log(torch.tensor([[0.4, 0.1, 0.9, 0.9, 1.0]])),  # what version 0 gave each token
                  1: prox.clone()}  # version 1 is the proximal policy itself
    behaviour = torch.where(versions == 0, by_version[0], by_version[1])  # the engine's rollout_log_probs
    weights, kept, _ = ca.compute_rollout_correction(prox, behaviour, mask, CFG)
    # v0 tokens: 0.2 / 0.4 = 0.5 and 0.3 / 0.1 = 3 truncated to 2; v1 tokens: 1; padding 0
    assert torch.allclose(weights, torch.tensor([[0.5, 2.0, 1.0, 1.0, 0.0]]), atol=1e-6)
    assert torch.equal(kept, mask)

    # the updated policy's ratios to the proximal one: 1.1, 1.3 (clipped at 1.2), 0.7, 1.0; advantage +1
    log_prob = (prox + torch.log(torch.tensor([[1.1, 1.3, 0.7, 1.0, 1.0]]))).requires_grad_(True)
    advantages = torch.ones(1, 5)
    loss, clipfrac, _, _ = ca.compute_policy_loss_vanilla(prox, log_prob, advantages, mask, "token-mean",
                                                          rollout_is_weights=weights, clip_ratio=0.2)
    # per token -w * min(r, clip(r)): -0.5 * 1.1, -2 * 1.2, -1 * 0.7, -1 * 1.0 -> mean over 4 tokens
    assert loss.item() == pytest.approx(-(0.55 + 2.4 + 0.7 + 1.0) / 4, abs=1e-6)
    assert clipfrac.item() == pytest.approx(0.25)
    loss.backward()
    # d/dlog_prob of -w r A is -w r / 4 where unclipped; the clipped token (r = 1.3 > 1.2) gets no gradient
    expected = torch.tensor([[-0.5 * 1.1, 0.0, -0.7, -1.0, 0.0]]) / 4
    assert torch.allclose(log_prob.grad, expected, atol=1e-6)

