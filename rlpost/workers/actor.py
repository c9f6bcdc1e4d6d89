"""The per-process PPO actor: log-probs of response tokens and the policy update, on one model shard.

Works on a `DataProto` (or anything with `.batch` and `.meta_info`) holding this rank's rows; the worker
(`fsdp_workers.py`) owns FSDP, offload and the engine. Config: the `actor_rollout_ref.actor` group, with
`ppo_mini_batch_size` already normalised to rows per rank by the worker.
"""

from __future__ import annotations

from typing import Any

import torch

from rlpost import keys
from rlpost.trainer.ppo.core_algos import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from rlpost.utils.padding import next_token_labels, pad_output, unpad_input
from rlpost.workers.batching import TensorDict, cfg_get, micro_batches, train_epochs

_MODEL_INPUTS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)


def forward_response_logits(module: torch.nn.Module, mb: TensorDict, use_remove_padding: bool,
                            logits_fn: Any) -> torch.Tensor:
    """Run the model and return `logits_fn(out, labels)` at the positions that predict response tokens.

    Positions P-1 .. T-2 predict the response tokens P .. T-1. With remove-padding the real tokens are
    packed into one row (see `rlpost.utils.padding`) and the per-token result is scattered back.

    Args:
        mb: `input_ids`, `attention_mask`, `position_ids` (b, T) and `responses` (b, R).
        logits_fn: maps (model output tensor (n, C) float, labels (n,)) -> per-token tensor (n, K) or (n,).

    Returns:
        (b, R) or (b, R, K) tensor.
    """
    ids, mask, pos = mb[keys.INPUT_IDS], mb[keys.ATTENTION_MASK], mb[keys.POSITION_IDS]
    b, t = ids.shape
    r = mb[keys.RESPONSES].shape[1]
    if use_remove_padding:
        packed_ids, packed_pos, idx = unpad_input(ids, mask, pos)
        out = module(input_ids=packed_ids, position_ids=packed_pos, attention_mask=None, use_cache=False)
        per_tok = logits_fn(out.logits.squeeze(0), next_token_labels(packed_ids))
        return pad_output(per_tok, idx, b, t)[:, -r - 1:-1]
    out = module(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    logits = out.logits[:, -r - 1:-1]
    per_tok = logits_fn(logits.reshape(b * r, -1), mb[keys.RESPONSES].reshape(-1))
    return per_tok.reshape(b, r, *per_tok.shape[1:])


class DataParallelPPOActor:
    """PPO actor maths on an (FSDP-sharded) causal LM.

    Args:
        config: actor config (`ppo_mini_batch_size` in rows per rank, `ppo_micro_batch_size_per_gpu`,
            `use_dynamic_bsz`, `ppo_max_token_len_per_gpu`, `ppo_epochs`, `shuffle`, `data_loader_seed`,
            `clip_ratio*`, `entropy_coeff`, `use_kl_loss`, `kl_loss_coef`, `kl_loss_type`, `loss_agg_mode`,
            `grad_clip`, `policy_loss.loss_mode`).
        module: the causal LM. optimizer: None for a frozen (reference) model.
        use_remove_padding: pack real tokens instead of running pad tokens.
    """

    def __init__(self, config: Any, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 use_remove_padding: bool = False) -> None:
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.use_remove_padding = use_remove_padding

    def _forward_micro_batch(self, mb: TensorDict, temperature: float, calculate_entropy: bool
                             ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Entropy (b, R) or None and log-probs (b, R) of the response tokens, logits / temperature."""

        def fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            scaled = logits.float() / temperature
            logp = logprobs_from_logits(scaled, labels)
            if not calculate_entropy:
                return logp.unsqueeze(-1)
            return torch.stack([logp, entropy_from_logits(scaled)], dim=-1)

        both = forward_response_logits(self.module, mb, self.use_remove_padding, fn)
        return (both[..., 1] if calculate_entropy else None), both[..., 0]

    @torch.no_grad()
    def compute_log_prob(self, data: Any, calculate_entropy: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) (and entropies (B, R)) of `responses` under the current weights.

        Reads batch `input_ids`, `attention_mask`, `position_ids`, `responses`; meta_info `temperature`,
        `micro_batch_size`, `use_dynamic_bsz`, `max_token_len`.
        """
        meta = data.meta_info
        tensors = {k: data.batch[k] for k in _MODEL_INPUTS}
        micros, rev = micro_batches(tensors, int(meta.get("micro_batch_size") or 1),
                                    bool(meta.get("use_dynamic_bsz", False)), int(meta.get("max_token_len") or 0))
        temperature = float(meta.get(keys.META_TEMPERATURE, 1.0))
        logps, ents = [], []
        for mb in micros:
            ent, logp = self._forward_micro_batch(mb, temperature, calculate_entropy)
            logps.append(logp)
            ents.append(ent)
        log_probs = torch.cat(logps)
        entropys = torch.cat(ents) if calculate_entropy else None
        if rev is not None:
            log_probs = log_probs[rev]
            entropys = entropys[rev] if entropys is not None else None
        return log_probs, entropys

    def _micro_loss(self, mb: TensorDict, temperature: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Total loss of one micro-batch (pg - entropy_coeff * entropy + kl_loss_coef * kl) and its metrics."""
        cfg = self.config
        mode = str(cfg_get(cfg, "loss_agg_mode", "token-mean"))
        entropy_coeff = float(cfg_get(cfg, "entropy_coeff", 0.0))
        ent, logp = self._forward_micro_batch(mb, temperature, calculate_entropy=entropy_coeff != 0)
        mask = mb[keys.RESPONSE_MASK]
        loss_mode = str(cfg_get(cfg_get(cfg, "policy_loss", None), "loss_mode", "vanilla"))
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = get_policy_loss_fn(loss_mode)(
            old_log_prob=mb[keys.OLD_LOG_PROBS], log_prob=logp, advantages=mb[keys.ADVANTAGES],
            response_mask=mask, loss_agg_mode=mode, config=cfg)
        loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss.item(), "actor/pg_clipfrac": clipfrac.item(),
                   "actor/ppo_kl": ppo_kl.item(), "actor/pg_clipfrac_lower": clipfrac_lower.item()}
        if ent is not None:
            entropy = agg_loss(ent, mask, mode)
            loss = loss - entropy_coeff * entropy
            metrics["actor/entropy"] = entropy.item()
        if cfg_get(cfg, "use_kl_loss", False):
            kld = kl_penalty(logp, mb[keys.REF_LOG_PROB], str(cfg_get(cfg, "kl_loss_type", "low_var_kl")))
            kl_loss = agg_loss(kld, mask, mode)
            loss = loss + float(cfg_get(cfg, "kl_loss_coef", 0.001)) * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
            metrics["actor/kl_coef"] = float(cfg_get(cfg, "kl_loss_coef", 0.001))
        return loss, metrics

    def update_policy(self, data: Any) -> dict[str, list[float]]:
        """`ppo_epochs` passes of mini-batch optimiser steps over this rank's rows.

        Reads batch `input_ids`, `attention_mask`, `position_ids`, `responses`, `response_mask`,
        `old_log_probs`, `advantages` (+ `ref_log_prob` when use_kl_loss); meta_info `temperature`.

        Returns:
            metrics: name -> one value per mini-batch (actor/pg_loss, actor/grad_norm, ...).
        """
        cfg = self.config
        wanted = [*_MODEL_INPUTS, keys.RESPONSE_MASK, keys.OLD_LOG_PROBS, keys.ADVANTAGES]
        if cfg_get(cfg, "use_kl_loss", False):
            wanted.append(keys.REF_LOG_PROB)
        tensors = {k: data.batch[k] for k in wanted}
        temperature = float(data.meta_info.get(keys.META_TEMPERATURE, 1.0))
        return train_epochs(self.module, self.optimizer, cfg, tensors,
                            lambda mb: self._micro_loss(mb, temperature), "actor")
