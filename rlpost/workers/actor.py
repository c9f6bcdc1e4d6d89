"""The per-process PPO actor: log-probs of response tokens and the policy update, on one model shard.

Works on a `DataProto` (or anything with `.batch` and `.meta_info`) holding this rank's rows; the worker
(`fsdp_workers.py`) owns FSDP, offload and the engine. Config: the `actor_rollout_ref.actor` group (read only);
the mini-batch in rows per rank comes from the worker (`mini_batch_rows`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from rlpost import keys
from rlpost.algos import agg_loss, get_policy_loss_fn, kl_penalty
from rlpost.utils.padding import next_token_labels, pad_output, unpad_input
from rlpost.utils.ulysses import (SHARD_KWARG, SequenceParallel, gather_sequence, shard_packed_row, sp_size,
                                  sync_rng)
from rlpost.workers.batching import TensorDict, micro_batches, train_epochs

_MODEL_INPUTS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)
_CHUNK_TOKENS = 4096  # rows of (tokens, V) float32 temporaries per step: 4096 x 152k x 4 B = 2.5 GB


def _accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    """True for HF causal LMs whose forward can skip the LM head on unwanted positions."""
    return "logits_to_keep" in inspect.signature(type(module).forward).parameters


def _response_positions(mask: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed-row indices of the real tokens at positions T-R-1 .. T-2 (those predicting the response).

    Args:
        mask: (b, T) attention mask. r: response length R.

    Returns:
        keep: (n,) indices into the packed row of `unpad_input`. grid: (n,) their flat (b * T) indices.
    """
    b, t = mask.shape
    flat = mask.reshape(-1).bool()
    col = torch.arange(t, device=mask.device).expand(b, t).reshape(-1)
    wanted = flat & (col >= t - r - 1) & (col <= t - 2)
    packed_pos = torch.cumsum(flat.long(), 0) - 1  # position of each real token in the packed row
    grid = torch.nonzero(wanted, as_tuple=False).squeeze(-1)
    return packed_pos[grid], grid


def _sequence_parallel_forward(module: torch.nn.Module, packed_ids: torch.Tensor, packed_pos: torch.Tensor,
                               mask: torch.Tensor, keep: torch.Tensor, logits_fn: Any,
                               sp: SequenceParallel) -> torch.Tensor:
    """`logits_fn` at the packed positions `keep`, each rank of the SP group running its slice of the row.

    Every rank applies the head to the kept positions of its own slice, writes them into an (L, K) buffer and
    the buffers are gathered along the sequence (`rlpost.utils.ulysses`), so all ranks return the same values.

    Args:
        packed_ids, packed_pos: (1, N) packed row. mask: (b, T) attention mask (sequence lengths).
        keep: (n,) sorted packed positions whose output is wanted.

    Returns:
        (n, K) or (n,) per-token tensor, identical on every rank of the group.
    """
    labels = next_token_labels(packed_ids)
    shard = shard_packed_row(packed_ids, packed_pos, mask.sum(-1), sp)
    local = keep[(keep >= shard.start) & (keep < shard.start + shard.length)] - shard.start
    extra = {"logits_to_keep": local} if _accepts_logits_to_keep(module) else {}
    out = module(input_ids=shard.input_ids, position_ids=shard.position_ids, attention_mask=None,
                 use_cache=False, **{SHARD_KWARG: shard}, **extra)
    logits = out.logits.squeeze(0)
    per_tok = logits_fn(logits if extra else logits[local], labels[local + shard.start])
    if local.numel() == 0 and logits.requires_grad:
        # No kept token in this slice, but the backward must still run through this rank's model: its
        # all-to-alls pair with the other ranks'.
        per_tok = per_tok + logits.sum() * 0
    buffer = per_tok.new_zeros((shard.length, *per_tok.shape[1:]))
    buffer = buffer.index_put((local,), per_tok)
    return gather_sequence(buffer, sp)[keep]


def forward_response_logits(module: torch.nn.Module, mb: TensorDict, use_remove_padding: bool,
                            logits_fn: Any, sp: SequenceParallel | None = None) -> torch.Tensor:
    """Run the model and return `logits_fn(out, labels)` at the positions that predict response tokens.

    Positions P-1 .. T-2 predict the response tokens P .. T-1. A causal LM applies its LM head to those
    positions only (`logits_to_keep`): the (b, T, V) logits of the prompt are never built. With
    remove-padding the real tokens are packed into one row (see `rlpost.utils.padding`) and the per-token
    result is scattered back (zeros on pad positions); with an SP group each rank runs a slice of that row.

    Args:
        mb: `input_ids`, `attention_mask`, `position_ids` (b, T) and `responses` (b, R).
        logits_fn: maps (model output tensor (n, C), labels (n,)) -> per-token tensor (n, K) or (n,).
        sp: Ulysses group (needs `use_remove_padding`); None without sequence parallelism.

    Returns:
        (b, R) or (b, R, K) tensor.
    """
    ids, mask, pos = mb[keys.INPUT_IDS], mb[keys.ATTENTION_MASK], mb[keys.POSITION_IDS]
    b, t = ids.shape
    r = mb[keys.RESPONSES].shape[1]
    head_only = _accepts_logits_to_keep(module)
    if sp is not None and not use_remove_padding:
        raise ValueError("Ulysses sequence parallelism runs on packed rows: it needs use_remove_padding=true")
    if use_remove_padding:
        packed_ids, packed_pos, idx = unpad_input(ids, mask, pos)
        if sp is not None:
            keep, grid = _response_positions(mask, r)
            per_tok = _sequence_parallel_forward(module, packed_ids, packed_pos, mask, keep, logits_fn, sp)
            return pad_output(per_tok, grid, b, t)[:, -r - 1:-1]
        labels = next_token_labels(packed_ids)
        if not head_only:
            out = module(input_ids=packed_ids, position_ids=packed_pos, attention_mask=None, use_cache=False)
            return pad_output(logits_fn(out.logits.squeeze(0), labels), idx, b, t)[:, -r - 1:-1]
        keep, grid = _response_positions(mask, r)
        out = module(input_ids=packed_ids, position_ids=packed_pos, attention_mask=None, use_cache=False,
                     logits_to_keep=keep)
        per_tok = logits_fn(out.logits.squeeze(0), labels[keep])
        return pad_output(per_tok, grid, b, t)[:, -r - 1:-1]
    extra = {"logits_to_keep": r + 1} if head_only else {}
    out = module(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **extra)
    logits = out.logits[:, -r - 1:-1]
    per_tok = logits_fn(logits.reshape(b * r, -1), mb[keys.RESPONSES].reshape(-1))
    return per_tok.reshape(b, r, *per_tok.shape[1:])


def token_logp_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                       with_entropy: bool = False, chunk: int = _CHUNK_TOKENS) -> torch.Tensor:
    """Log-prob of `labels` (and entropy) under softmax(logits / temperature), in float32 chunks.

    Without autograd one pass per chunk gives both: lse = logsumexp(z); logp = z[label] - lse;
    entropy = lse - sum(p * z); no (chunk, V) result is written. With autograd the chunk goes through
    `log_softmax`, whose backward is one fused kernel (logsumexp's takes a subtract, an exp and a
    multiply over the whole chunk: ~0.3 s more per 64x8 update of a 152k-vocab model on an H100).
    Only `chunk` rows of float32 logits exist at a time, plus what autograd saves per chunk.

    Args:
        logits: (n, V) any float dtype. labels: (n,) token ids.

    Returns:
        (n, 1) log-probs, or (n, 2) [log-prob, entropy] when `with_entropy`; float32.
    """
    parts = []
    for i in range(0, logits.shape[0], chunk):
        z = logits[i:i + chunk].float()
        if temperature != 1.0:
            z = z / temperature
        index = labels[i:i + chunk, None].long()
        if torch.is_grad_enabled():
            logp_all = torch.log_softmax(z, dim=-1)
            logp = logp_all.gather(-1, index).squeeze(-1)
            ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
        else:
            lse = torch.logsumexp(z, dim=-1)
            logp = z.gather(-1, index).squeeze(-1) - lse
            ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1) if with_entropy else None
        parts.append(logp[:, None] if ent is None else torch.stack([logp, ent], dim=-1))
    if not parts:
        return logits.new_zeros((0, 2 if with_entropy else 1), dtype=torch.float32)
    return torch.cat(parts)


class DataParallelPPOActor:
    """PPO actor maths on an (FSDP-sharded) causal LM.

    Args:
        config: actor config (`ppo_micro_batch_size_per_gpu`,
            `use_dynamic_bsz`, `ppo_max_token_len_per_gpu`, `ppo_epochs`, `shuffle`, `data_loader_seed`,
            `clip_ratio*`, `entropy_coeff`, `use_kl_loss`, `kl_loss_coef`, `kl_loss_type`, `loss_agg_mode`,
            `grad_clip`, `policy_loss.loss_mode` and the keys that loss reads, see `rlpost.algos.losses`).
        module: the causal LM. optimizer: None for a frozen (reference) model.
        use_remove_padding: pack real tokens instead of running pad tokens.
        mini_batch_rows: rows per PPO mini-batch on this rank (ppo_mini_batch_size x rollout.n / dp size).
        sp: Ulysses group (all its ranks get the same rows); None without sequence parallelism.
    """

    def __init__(self, config: Any, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 use_remove_padding: bool = False, mini_batch_rows: int | None = None,
                 sp: SequenceParallel | None = None) -> None:
        self.config = config
        self.mini_batch_rows = mini_batch_rows  # rows per mini-batch on this rank; None for a frozen model
        self.module = module
        self.optimizer = optimizer
        self.use_remove_padding = use_remove_padding
        self.sp = sp

    def _forward_micro_batch(self, mb: TensorDict, temperature: float, calculate_entropy: bool
                             ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Entropy (b, R) or None and log-probs (b, R) of the response tokens, logits / temperature."""

        def fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return token_logp_entropy(logits, labels, temperature, calculate_entropy)

        both = forward_response_logits(self.module, mb, self.use_remove_padding, fn, self.sp)
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

    def _micro_loss(self, mb: TensorDict, temperature: float
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """Total loss of one micro-batch (pg - entropy_coeff * entropy + kl_loss_coef * kl) and its metrics.

        The policy loss is `policy_loss.loss_mode` from the registry; when the micro-batch carries
        `rollout_is_weights` (off-policy rollout correction) they go to the loss, which multiplies the
        per-token policy-gradient loss by them before aggregation. Metrics stay 0-dim device tensors
        (detached): `train_epochs` reads them once per mini-batch, so no micro-batch waits for the
        device. The entropy is only computed when entropy_coeff != 0 (the trainer logs actor/entropy
        from `compute_log_prob`'s `entropys`).
        """
        cfg = self.config
        mode = cfg.loss_agg_mode
        entropy_coeff = float(cfg.entropy_coeff)
        ent, logp = self._forward_micro_batch(mb, temperature, calculate_entropy=entropy_coeff != 0)
        mask = mb[keys.RESPONSE_MASK]
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = get_policy_loss_fn(cfg.policy_loss.loss_mode)(
            old_log_prob=mb[keys.OLD_LOG_PROBS], log_prob=logp, advantages=mb[keys.ADVANTAGES],
            response_mask=mask, loss_agg_mode=mode, config=cfg,
            rollout_is_weights=mb.get(keys.ROLLOUT_IS_WEIGHTS))
        loss = pg_loss
        metrics: dict[str, torch.Tensor | float] = {
            "actor/pg_loss": pg_loss.detach(), "actor/pg_clipfrac": clipfrac.detach(),
            "actor/ppo_kl": ppo_kl.detach(), "actor/pg_clipfrac_lower": clipfrac_lower.detach()}
        if ent is not None:
            entropy = agg_loss(ent, mask, mode)
            loss = loss - entropy_coeff * entropy
            metrics["actor/entropy"] = entropy.detach()
        if cfg.use_kl_loss:
            kld = kl_penalty(logp, mb[keys.REF_LOG_PROB], cfg.kl_loss_type)
            kl_loss = agg_loss(kld, mask, mode)
            loss = loss + float(cfg.kl_loss_coef) * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
            metrics["actor/kl_coef"] = float(cfg.kl_loss_coef)
        return loss, metrics

    def update_policy(self, data: Any) -> dict[str, list[float]]:
        """`ppo_epochs` passes of mini-batch optimiser steps over this rank's rows.

        Reads batch `input_ids`, `attention_mask`, `position_ids`, `responses`, `response_mask`,
        `old_log_probs`, `advantages` (+ `ref_log_prob` when use_kl_loss, + `rollout_is_weights` when
        present); meta_info `temperature`.

        Returns:
            metrics: name -> one value per mini-batch (actor/pg_loss, actor/grad_norm, ...).
        """
        cfg = self.config
        wanted = [*_MODEL_INPUTS, keys.RESPONSE_MASK, keys.OLD_LOG_PROBS, keys.ADVANTAGES]
        if cfg.use_kl_loss:
            wanted.append(keys.REF_LOG_PROB)
        if keys.ROLLOUT_IS_WEIGHTS in data.batch.keys():
            wanted.append(keys.ROLLOUT_IS_WEIGHTS)
        tensors = {k: data.batch[k] for k in wanted}
        temperature = float(data.meta_info.get(keys.META_TEMPERATURE, 1.0))
        if self.sp is not None and cfg.shuffle and cfg.data_loader_seed is None:
            sync_rng(self.sp)
        return train_epochs(self.module, self.optimizer, cfg, tensors,
                            lambda mb: self._micro_loss(mb, temperature), "actor",
                            self.mini_batch_rows, cfg.data_loader_seed, sp_size=sp_size(self.sp))
