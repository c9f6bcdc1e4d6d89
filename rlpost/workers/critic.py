"""The per-process PPO critic: values of response positions and the clipped value-loss update.

The model is a token-classification head with one label on the actor's backbone family
(`AutoModelForTokenClassification`, `num_labels=1`). Config: the `critic` group; the mini-batch in rows per
rank is computed by the worker and passed in (`mini_batch_rows`).
"""

from __future__ import annotations

from typing import Any

import torch

from rlpost import keys
from rlpost.algos import compute_value_loss
from rlpost.utils.masked import masked_mean
from rlpost.engine.ulysses import SequenceParallel, sp_size, sync_rng
from rlpost.workers.actor import forward_response_logits
from rlpost.workers.batching import TensorDict, micro_batches, train_epochs

_MODEL_INPUTS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)


def _values_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(n, 1) value-head output -> (n,) float values (labels unused)."""
    return logits[:, 0].float()


class DataParallelPPOCritic:
    """PPO critic maths on an (FSDP-sharded) value model.

    Args:
        config: critic config (`ppo_micro_batch_size_per_gpu`, `use_dynamic_bsz`, `ppo_max_token_len_per_gpu`,
            `ppo_epochs`, `shuffle`, `cliprange_value`, `loss_agg_mode`, `grad_clip`).
        module: the value model. optimizer: its AdamW. use_remove_padding: pack real tokens.
        mini_batch_rows: rows per mini-batch on this rank (critic.ppo_mini_batch_size x rollout_n / dp).
        sp: Ulysses group (all its ranks get the same rows); None without sequence parallelism.
    """

    def __init__(self, config: Any, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 use_remove_padding: bool, mini_batch_rows: int, sp: SequenceParallel | None = None) -> None:
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.use_remove_padding = use_remove_padding
        self.mini_batch_rows = mini_batch_rows
        self.sp = sp

    def _values(self, mb: TensorDict) -> torch.Tensor:
        """(b, R) values at positions P-1 .. T-2, zeroed outside `attention_mask` of the response."""
        vals = forward_response_logits(self.module, mb, self.use_remove_padding, _values_of, self.sp)
        resp_mask = mb[keys.ATTENTION_MASK][:, -vals.shape[1]:]
        return vals * resp_mask.to(vals.dtype)

    @torch.no_grad()
    def compute_values(self, data: Any) -> torch.Tensor:
        """Values (B, R). Reads `input_ids`, `attention_mask`, `position_ids`, `responses`;
        meta_info `micro_batch_size`, `use_dynamic_bsz`, `max_token_len`."""
        meta = data.meta_info
        tensors = {k: data.batch[k] for k in _MODEL_INPUTS}
        micros, rev = micro_batches(tensors, meta["micro_batch_size"], bool(meta["use_dynamic_bsz"]),
                                    int(meta["max_token_len"]))
        values = torch.cat([self._values(mb) for mb in micros])
        return values[rev] if rev is not None else values

    def _micro_loss(self, mb: TensorDict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped value loss of one micro-batch; metrics as detached 0-dim tensors (read per mini-batch)."""
        mode = str(self.config.loss_agg_mode)
        vpreds = self._values(mb)
        mask = mb[keys.RESPONSE_MASK]
        vf_loss, clipfrac = compute_value_loss(
            vpreds=vpreds, returns=mb[keys.RETURNS], values=mb[keys.VALUES], response_mask=mask,
            cliprange_value=float(self.config.cliprange_value), loss_agg_mode=mode)
        metrics = {"critic/vf_loss": vf_loss.detach(), "critic/vf_clipfrac": clipfrac.detach(),
                   "critic/vpred_mean": masked_mean(vpreds, mask).detach()}
        return vf_loss, metrics

    def update_critic(self, data: Any) -> dict[str, list[float]]:
        """Mini-batch steps on the clipped value loss. Reads `input_ids`, `attention_mask`, `position_ids`,
        `responses`, `response_mask`, `values`, `returns`. Returns metrics, one value per mini-batch."""
        cfg = self.config
        wanted = [*_MODEL_INPUTS, keys.RESPONSE_MASK, keys.VALUES, keys.RETURNS]
        tensors = {k: data.batch[k] for k in wanted}
        if self.sp is not None and cfg.shuffle and cfg.data_loader_seed is None:
            sync_rng(self.sp)
        return train_epochs(self.module, self.optimizer, cfg, tensors, self._micro_loss, "critic",
                            self.mini_batch_rows, shuffle_seed=self.config.data_loader_seed,
                            sp_size=sp_size(self.sp),
                            defer_grad_sync=bool(cfg.model.fsdp_config.use_no_sync_for_gradient_accumulation))
