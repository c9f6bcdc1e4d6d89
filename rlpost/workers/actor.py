"""The per-process PPO actor: log-probs of response tokens and the policy update, on one model shard.

Works on a `DataProto` (or anything with `.batch` and `.meta_info`) holding this rank's rows; the worker
(`fsdp_workers.py`) owns FSDP, offload and the engine. Config: the `actor_rollout_ref.actor` group (read only);
the mini-batch in rows per rank comes from the worker (`mini_batch_rows`).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from rlpost import keys
from rlpost.algos import agg_loss, compute_policy_loss_vanilla, get_policy_loss_fn, kl_penalty
from rlpost.algos.rollout_correction import bypass_policy_loss
from rlpost.algos.distillation import distillation_loss, is_topk_mode, mask_duplicate_ids
from rlpost.engine import triton_logprob
from rlpost.engine.fused_logprob import FusedHeadOptions, chunk_stats, compiled, eager, fused_lm_head
from rlpost.engine.packed_attention import PACKED_KWARG, packed_sequences
from rlpost.engine.vision import (language_model_slice, mm_rows, model_kwargs, pack_positions, real_placeholders,
                                  vision_inputs)
from rlpost.utils.masked import masked_mean
from rlpost.utils.moe_aux_loss import router_aux_loss
from rlpost.utils.router_replay import ReplayState, from_grid, replay_metrics, to_grid
from rlpost.utils.padding import next_token_labels, pad_output, unpad_input
from rlpost.engine.ulysses import (SHARD_KWARG, SequenceParallel, gather_sequence, pad_packed_row,
                                  shard_packed_row, sp_size, sync_rng)
from rlpost.workers.batching import TensorDict, micro_batches, train_epochs

_MODEL_INPUTS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)
_LOG_RATIO_MOMENTS = ("actor/_log_ratio_mean", "actor/_log_ratio_sq_mean")


def log_ratio_moments(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """A micro-batch's token means of log pi_theta - log pi_old and of its square (0-dim, no device sync):
    `train_epochs` weights them by the micro-batch's share, so per mini-batch they are the mini-batch's moments."""
    return dict(zip(_LOG_RATIO_MOMENTS, (masked_mean(log_ratio, mask), masked_mean(log_ratio * log_ratio, mask))))


def with_log_ratio_std(metrics: dict[str, list[float]]) -> dict[str, list[float]]:
    """`actor/log_ratio_std` per mini-batch, sqrt(E[d^2] - E[d]^2) of d = log pi_theta - log pi_old over its
    response tokens (the importance ratio's spread in log space), in place of the two moments."""
    mean, sq = (metrics.pop(k, []) for k in _LOG_RATIO_MOMENTS)
    if mean:
        metrics["actor/log_ratio_std"] = [max(s - m * m, 0.0) ** 0.5 for m, s in zip(mean, sq)]
    return metrics
_CHUNK_TOKENS = 4096  # rows of (tokens, V) float32 temporaries per step: 4096 x 152k x 4 B = 2.5 GB


def _accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    """True for HF causal LMs whose forward can skip the LM head on unwanted positions."""
    return "logits_to_keep" in inspect.signature(type(module).forward).parameters


def _takes_extra_kwargs(module: torch.nn.Module) -> bool:
    """True when the forward passes extra keyword arguments on (HF models hand them to the attention)."""
    params = inspect.signature(type(module).forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


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


def _run_head(module: torch.nn.Module, labels: torch.Tensor, logits_fn: Any, fused: FusedHeadOptions | None,
              **inputs: Any) -> torch.Tensor:
    """Model forward whose LM head sees exactly the wanted positions (`logits_to_keep` in `inputs`).

    Args:
        labels: (...) next-token ids of those positions.
        logits_fn: maps (logits (n, V), labels (n,)) -> (n, K) or (n,); unused when `fused`.
        fused: run the head as `rlpost.engine.fused_logprob.fused_lm_head` (no logits); None: the model's head.

    Returns:
        (n, K) or (n,) per-position values, n = labels.numel(); fused: (n, 2) [log-prob, entropy].
    """
    if fused is None:
        logits = module(**inputs).logits
        return logits_fn(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    with fused_lm_head(module, labels, fused):
        out = module(**inputs).logits
    return out.reshape(-1, out.shape[-1])


def sequence_parallel_forward(module: torch.nn.Module, packed_ids: torch.Tensor, packed_pos: torch.Tensor,
                               mask: torch.Tensor, keep: torch.Tensor, logits_fn: Any,
                               sp: SequenceParallel, fused: FusedHeadOptions | None,
                               pixels: dict | None = None, image_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`logits_fn` at the packed positions `keep`, each rank of the SP group running its slice of the row.

    Every rank applies the head to the kept positions of its own slice, writes them into an (L, K) buffer and
    the buffers are gathered along the sequence (`rlpost.engine.ulysses`), so all ranks return the same values.

    Args:
        packed_ids: (1, N) packed row. packed_pos: (1, N) its positions, or (3, 1, N) mrope positions.
        mask: (b, T) attention mask (sequence lengths).
        keep: (n,) sorted packed positions whose output is wanted. fused: see `_run_head`.
        pixels: `pixel_values` and `image_grid_thw` of the row's images (a vision-language model), or None: the
            model then embeds the whole row and its language model runs this rank's slice.
        image_mask: (1, N0) the row's real image placeholders (`rlpost.engine.vision.real_placeholders`).

    Returns:
        (n, K) or (n,) per-token tensor, identical on every rank of the group.
    """
    labels = next_token_labels(packed_ids)
    shard = shard_packed_row(packed_ids, packed_pos, mask.sum(-1), sp)
    local = keep[(keep >= shard.start) & (keep < shard.start + shard.length)] - shard.start
    inputs = {"input_ids": shard.input_ids, "position_ids": shard.position_ids, "attention_mask": None,
              "use_cache": False, SHARD_KWARG: shard}
    sliced: Any = contextlib.nullcontext()
    if pixels:
        full_ids, full_pos, pad = pad_packed_row(packed_ids, packed_pos, sp.size)
        inputs.update(input_ids=full_ids, position_ids=full_pos, **pixels)
        full_mask = None if image_mask is None else torch.nn.functional.pad(image_mask, (0, pad))
        sliced = contextlib.ExitStack()
        sliced.enter_context(real_placeholders(module, full_mask))
        sliced.enter_context(language_model_slice(module, shard.start, shard.length))
    if _accepts_logits_to_keep(module):
        with sliced:
            per_tok = _run_head(module, labels[local + shard.start], logits_fn, fused, logits_to_keep=local,
                                **inputs)
    else:
        with sliced:
            logits = module(**inputs).logits.squeeze(0)
        per_tok = logits_fn(logits[local], labels[local + shard.start])
        if local.numel() == 0 and logits.requires_grad:
            # No kept token in this slice, but the backward must still run through this rank's model: its
            # all-to-alls pair with the other ranks' (`token_logp_entropy` keeps its empty output attached).
            per_tok = per_tok + logits.sum() * 0
    buffer = per_tok.new_zeros((shard.length, *per_tok.shape[1:]))
    buffer = buffer.index_put((local,), per_tok)
    return gather_sequence(buffer, sp)[keep]


def forward_response_logits(module: torch.nn.Module, mb: TensorDict, use_remove_padding: bool,
                            logits_fn: Any, sp: SequenceParallel | None = None,
                            fused: FusedHeadOptions | None = None, vision: dict | None = None) -> torch.Tensor:
    """Run the model and return `logits_fn(out, labels)` at the positions that predict response tokens.

    Positions P-1 .. T-2 predict the response tokens P .. T-1. A causal LM applies its LM head to those
    positions only (`logits_to_keep`): the (b, T, V) logits of the prompt are never built. With
    remove-padding the real tokens are packed into one row (see `rlpost.utils.padding`; attention by
    `rlpost.engine.packed_attention`) and the per-token result is scattered back (zeros on pad positions);
    with an SP group each rank runs a slice of that row.

    Args:
        mb: `input_ids`, `attention_mask`, `position_ids` (b, T) and `responses` (b, R).
        logits_fn: maps (model output tensor (n, C), labels (n,)) -> per-token tensor (n, K) or (n,).
        sp: Ulysses group (needs `use_remove_padding`); None without sequence parallelism.
        fused: fused LM head + log-prob options (a causal LM taking `logits_to_keep`; `logits_fn` unused);
            None: the model's head, then `logits_fn`.
        vision: the micro-batch's vision inputs (`rlpost.engine.vision.vision_inputs`: pixels, grids and mrope
            `position_ids` (3, b, T), packed to (3, 1, N) with remove-padding); None or {} for text rows.

    Returns:
        (b, R) or (b, R, K) tensor.
    """
    ids, mask, pos = mb[keys.INPUT_IDS], mb[keys.ATTENTION_MASK], mb[keys.POSITION_IDS]
    b, t = ids.shape
    r = mb[keys.RESPONSES].shape[1]
    head_only = _accepts_logits_to_keep(module)
    if sp is not None and not use_remove_padding:
        raise ValueError("Ulysses sequence parallelism runs on packed rows: it needs use_remove_padding=true")
    if fused is not None and not head_only:
        raise ValueError(f"use_fused_kernels needs a causal LM whose forward takes logits_to_keep; "
                         f"{type(module).__name__} does not: set actor_rollout_ref.model.use_fused_kernels=false")
    vision = vision or {}
    image_mask = vision.get(keys.IMAGE_MASK)
    if use_remove_padding:
        packed_ids, packed_pos, idx = unpad_input(ids, mask, pos)
        pixels = {k: v for k, v in model_kwargs(vision).items() if k != keys.POSITION_IDS}
        if vision:
            packed_pos = pack_positions(vision[keys.POSITION_IDS], mask)
            image_mask = pack_positions(image_mask, mask)
        if sp is not None:
            keep, grid = _response_positions(mask, r)
            per_tok = sequence_parallel_forward(module, packed_ids, packed_pos, mask, keep, logits_fn, sp, fused,
                                                pixels, image_mask)
            return pad_output(per_tok, grid, b, t)[:, -r - 1:-1]
        labels = next_token_labels(packed_ids)
        inputs = {"input_ids": packed_ids, "position_ids": packed_pos, "attention_mask": None, "use_cache": False,
                  **pixels}
        if _takes_extra_kwargs(module):  # else the attention finds the sequences from the position ids
            inputs[PACKED_KWARG] = packed_sequences(mask.sum(-1), ids.device)
        with real_placeholders(module, image_mask):
            if not head_only:
                out = module(**inputs)
                return pad_output(logits_fn(out.logits.squeeze(0), labels), idx, b, t)[:, -r - 1:-1]
            keep, grid = _response_positions(mask, r)
            per_tok = _run_head(module, labels[keep], logits_fn, fused, logits_to_keep=keep, **inputs)
        return pad_output(per_tok, grid, b, t)[:, -r - 1:-1]
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": False,
              **model_kwargs(vision)}
    with real_placeholders(module, image_mask):
        if not head_only:
            logits = module(**inputs).logits[:, -r - 1:-1]
            per_tok = logits_fn(logits.reshape(b * r, -1), mb[keys.RESPONSES].reshape(-1))
            return per_tok.reshape(b, r, *per_tok.shape[1:])
        wanted = torch.arange(t - r - 1, t - 1, device=ids.device)
        per_tok = _run_head(module, mb[keys.RESPONSES], logits_fn, fused, logits_to_keep=wanted, **inputs)
    return per_tok.reshape(b, r, *per_tok.shape[1:])


def _logp_entropy_grad(z: torch.Tensor, index: torch.Tensor, with_entropy: bool) -> torch.Tensor:
    """(n, 2) [log-prob, entropy] of float32 logits z (n, V) through `log_softmax` (one fused backward kernel;
    logsumexp's takes a subtract, an exp and a multiply over the whole chunk). Entropy 0 unless asked."""
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, index).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else torch.zeros_like(logp)
    return torch.stack([logp, ent], dim=-1)


def _logp_entropy_pi2(z: torch.Tensor, index: torch.Tensor, with_entropy: bool) -> torch.Tensor:
    """(n, 3) [log-prob, entropy, sum over the vocabulary of p^2] of float32 logits z (n, V); no autograd."""
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, index).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else torch.zeros_like(logp)
    return torch.stack([logp, ent, logp_all.mul_(2).exp_().sum(-1)], dim=-1)


def _logp_entropy_nograd(z: torch.Tensor, index: torch.Tensor, with_entropy: bool) -> torch.Tensor:
    """As `_logp_entropy_grad`, one pass without writing a (n, V) result (no autograd)."""
    _, logp, ent = chunk_stats(z, index.squeeze(-1), with_entropy)
    return torch.stack([logp, ent], dim=-1)


def _tempered(rows: torch.Tensor, temperature: float) -> torch.Tensor:
    z = rows.float()
    return z / temperature if temperature != 1.0 else z


def token_logp_entropy(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                       with_entropy: bool = False, chunk: int = _CHUNK_TOKENS, checkpoint: bool = False,
                       compile_fn: Any = eager, kernel: str = "auto", with_sum_pi_squared: bool = False
                       ) -> torch.Tensor:
    """Log-prob of `labels` (and entropy) under softmax(logits / temperature), maths in float32.

    On CUDA (compute capability >= 8.0) with Triton (`kernel` "auto") one Triton pass per row
    (`rlpost.engine.triton_logprob`): no float32 (tokens, V) tensor is built, so `chunk`, `checkpoint` and
    `compile_fn` have nothing to act on. Otherwise
    (CPU, or `kernel` "torch") PyTorch maths in float32 chunks: only `chunk` rows of float32 logits exist at a
    time, plus what autograd saves per chunk: the chunk's log-softmax and, with entropy, its probabilities;
    with `checkpoint` only the chunk's float32 logits, the rest recomputed in backward.

    Args:
        logits: (n, V) any float dtype. labels: (n,) token ids.
        checkpoint: recompute each chunk's log-softmax/entropy in backward instead of saving it.
        compile_fn: wraps the per-chunk maths (`rlpost.engine.fused_logprob.compiled` or `eager`).
        kernel: "auto" (Triton on CUDA when it imports) or "torch".
        with_sum_pi_squared: also sum_v p(v)^2 per row (the optimal token baseline's statistic), through the
            PyTorch chunks (no Triton kernel), without autograd.

    Returns:
        (n, 1) log-probs, or (n, 2) [log-prob, entropy] when `with_entropy`, or (n, 3) [log-prob, entropy (0
        unless asked), sum p^2] with `with_sum_pi_squared`; float32.
    """
    if kernel not in ("auto", "torch"):
        raise ValueError(f"kernel must be 'auto' or 'torch', got {kernel!r}")
    if with_sum_pi_squared:
        if torch.is_grad_enabled() and logits.requires_grad:
            raise ValueError("with_sum_pi_squared is a statistic of the log-prob pass: call it without autograd")
        return torch.cat([_logp_entropy_pi2(_tempered(rows, temperature), index[:, None].long(), with_entropy)
                          for rows, index in zip(logits.split(chunk), labels.split(chunk))])
    if kernel == "auto" and triton_logprob.supports(logits):
        return triton_logprob.logp_entropy(logits, labels, temperature, with_entropy)
    grad = torch.is_grad_enabled() and logits.requires_grad
    body = compile_fn(_logp_entropy_grad if grad else _logp_entropy_nograd)
    parts = []
    # split, not slices: the backward of one slice would zero-fill and add a whole (n, V) gradient per chunk
    for rows, index in zip(logits.split(chunk), labels.split(chunk)):
        z = _tempered(rows, temperature)
        index = index[:, None].long()
        if grad and checkpoint:
            both = torch.utils.checkpoint.checkpoint(body, z, index, with_entropy, use_reentrant=False)
        else:
            both = body(z, index, with_entropy)
        parts.append(both if with_entropy else both[:, :1])
    # no rows: `split` still yields one empty chunk, so the result stays attached to the graph (a Ulysses
    # rank's backward must run even with no token)
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
        use_fused_kernels: the LM head and the log-prob/entropy as one chunked Function
            (`rlpost.engine.fused_logprob`), never writing (tokens, V) logits.

    The log-prob path also reads `use_torch_compile` (compile the per-chunk maths),
    `entropy_from_logits_with_chunking` (chunks of `entropy_from_logits_chunk_size` rows) and
    `entropy_checkpointing` (recompute each chunk's log-softmax/entropy in backward); the fused head always
    recomputes, so the last one changes nothing there.
    """

    def __init__(self, config: Any, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 use_remove_padding: bool = False, mini_batch_rows: int | None = None,
                 sp: SequenceParallel | None = None, use_fused_kernels: bool = False) -> None:
        self.config = config
        self.mini_batch_rows = mini_batch_rows  # rows per mini-batch on this rank; None for a frozen model
        self.module = module
        self.optimizer = optimizer
        self.use_remove_padding = use_remove_padding
        self.sp = sp
        self.use_fused_kernels = use_fused_kernels
        # entropy_from_logits_with_chunking: entropy_from_logits_chunk_size rows per chunk (verl's 2048: half the
        # float32 temporaries of the default)
        self._chunk = int(config.entropy_from_logits_chunk_size) if config.entropy_from_logits_with_chunking \
            else _CHUNK_TOKENS
        self._compile_fn = compiled if config.use_torch_compile else eager
        self.logprob_kernel = "auto"  # "torch": the PyTorch maths on CUDA too (benches compare the two)
        # MoE router replay (R2): the log-prob pass records each token's experts, the update replays them
        self.router_replay: ReplayState | None = None
        # the router load-balancing loss, when the model's config asks for it (output_router_logits)
        self.router_aux = router_aux_loss(module) if optimizer is not None else None
        self._distill: dict | None = None  # the distillation loss's settings of the current update (meta_info)
        self._bypass: dict | None = None  # algorithm.rollout_correction in bypass mode (meta_info), else None
        self._mm_rows: list[dict] | None = None  # the current batch's per-row multi_modal_inputs

    def _with_mm_rows(self, data: Any, tensors: TensorDict) -> TensorDict:
        """`tensors` plus `mm_row` (B,) when the rows carry `multi_modal_inputs` (kept as `_mm_rows`)."""
        self._mm_rows = mm_rows(data)
        if self._mm_rows is None:
            return tensors
        return {**tensors, keys.MM_ROW: torch.arange(len(self._mm_rows), device=tensors[keys.INPUT_IDS].device)}

    def _forward_micro_batch(self, mb: TensorDict, temperature: float, calculate_entropy: bool
                             ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Entropy (b, R) or None and log-probs (b, R) of the response tokens, logits / temperature."""
        both = self._forward_stats(mb, temperature, calculate_entropy, False)
        return (both[..., 1] if calculate_entropy else None), both[..., 0]

    def _forward_stats(self, mb: TensorDict, temperature: float, calculate_entropy: bool,
                       calculate_sum_pi_squared: bool) -> torch.Tensor:
        """(b, R, K) per response token: log-prob, then entropy (when asked, or as a 0 column before sum p^2),
        then sum p^2 (when asked; through the model's own head and PyTorch chunks, not the fused head)."""
        # half the rows per chunk: the fused backward holds its (chunk, V) float32 logits and probabilities
        fused = FusedHeadOptions(temperature, calculate_entropy, self._chunk // 2, self._compile_fn) \
            if self.use_fused_kernels and not calculate_sum_pi_squared else None

        def fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return token_logp_entropy(logits, labels, temperature, calculate_entropy, self._chunk,
                                      bool(self.config.entropy_checkpointing), self._compile_fn, self.logprob_kernel,
                                      calculate_sum_pi_squared)

        vision = None
        if keys.MM_ROW in mb:
            vision = vision_inputs(self.module, mb[keys.INPUT_IDS], mb[keys.ATTENTION_MASK], mb[keys.MM_ROW],
                                   self._mm_rows)
        return forward_response_logits(self.module, mb, self.use_remove_padding, fn, self.sp, fused, vision)

    def _topk_forward(self, mb: TensorDict, temperature: float, k: int, at_ids: torch.Tensor | None,
                      calculate_entropy: bool) -> dict[str, torch.Tensor]:
        """One padded forward (no packing, SP or fused head: the (b R, V) log-probs of the micro-batch are built)
        returning, per response position, `log_probs` (b, R) of the sampled token, `entropys` (b, R) when asked,
        the k likeliest tokens `topk_log_probs` / `topk_ids` (b, R, k) when k > 0, and `at_ids` (b, R, m): the
        log-probs of the ids `at_ids` (b, R, m) when given."""
        b, r = mb[keys.RESPONSES].shape
        held: dict[str, torch.Tensor] = {}

        def fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:  # the padded path calls it once
            log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
            if k > 0:
                held["topk_log_probs"], held["topk_ids"] = log_probs.topk(k, dim=-1)
            if at_ids is not None:
                held["at_ids"] = log_probs.gather(-1, at_ids.reshape(b * r, -1))
            return token_logp_entropy(logits, labels, temperature, calculate_entropy, self._chunk,
                                      bool(self.config.entropy_checkpointing), self._compile_fn, self.logprob_kernel)

        stats = forward_response_logits(self.module, mb, False, fn).reshape(b, r, -1)
        out = {name: value.reshape(b, r, -1) for name, value in held.items()}
        out[keys.OLD_LOG_PROBS] = stats[..., 0]
        if calculate_entropy:
            out[keys.ENTROPYS] = stats[..., 1]
        return out

    @torch.no_grad()
    def compute_topk(self, data: Any, k: int, at_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """`_topk_forward` over the rows (micro-batched like `compute_log_prob`): {old_log_probs (B, R),
        topk_log_probs, topk_ids (B, R, k) when k > 0, at_ids (B, R, m) when `at_ids` is given}."""
        meta = data.meta_info
        tensors = {name: data.batch[name] for name in _MODEL_INPUTS}
        if at_ids is not None:
            tensors["at_ids"] = at_ids
        micros, rev = micro_batches(tensors, int(meta.get("micro_batch_size") or 1),
                                    bool(meta.get("use_dynamic_bsz", False)), int(meta.get("max_token_len") or 0))
        temperature = float(meta.get(keys.META_TEMPERATURE, 1.0))
        parts = [self._topk_forward(mb, temperature, k, mb.get("at_ids"), False) for mb in micros]
        out = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
        return out if rev is None else {name: value[rev] for name, value in out.items()}

    @torch.no_grad()
    def compute_log_prob(self, data: Any, calculate_entropy: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) (and entropies (B, R)) of `responses` under the current weights.

        Reads batch `input_ids`, `attention_mask`, `position_ids`, `responses`; meta_info `temperature`,
        `micro_batch_size`, `use_dynamic_bsz`, `max_token_len`.
        """
        stats = self.compute_log_prob_stats(data, calculate_entropy, False)
        return stats[keys.OLD_LOG_PROBS], stats.get(keys.ENTROPYS)

    @torch.no_grad()
    def compute_log_prob_stats(self, data: Any, calculate_entropy: bool, calculate_sum_pi_squared: bool
                               ) -> dict[str, torch.Tensor]:
        """`compute_log_prob`'s pass returning {old_log_probs, entropys (when asked), sum_pi_squared (when
        asked)}, each (B, R) in the rows' order, and with router replay on, `routed_experts` (B, T, L, K): the
        experts each token was routed to (`rlpost.utils.router_replay`)."""
        meta = data.meta_info
        tensors = self._with_mm_rows(data, {k: data.batch[k] for k in _MODEL_INPUTS})
        micros, rev = micro_batches(tensors, int(meta.get("micro_batch_size") or 1),
                                    bool(meta.get("use_dynamic_bsz", False)), int(meta.get("max_token_len") or 0))
        temperature = float(meta.get(keys.META_TEMPERATURE, 1.0))
        per_tok, routed = [], []
        for mb in micros:
            if self.router_replay is not None:
                self.router_replay.mode = "record"
            try:
                per_tok.append(self._forward_stats(mb, temperature, calculate_entropy, calculate_sum_pi_squared)
                               .reshape(*mb[keys.RESPONSES].shape, -1))
            finally:  # a forward that raised leaves the routers routing as the model does
                if self.router_replay is not None:
                    self.router_replay.mode = None
            if self.router_replay is not None:
                routed.append(to_grid(self.router_replay.recorded, mb[keys.ATTENTION_MASK], self.use_remove_padding))
        per_tok = torch.cat(per_tok)
        if rev is not None:
            per_tok = per_tok[rev]
        out = {keys.OLD_LOG_PROBS: per_tok[..., 0]}
        if routed:
            out[keys.ROUTED_EXPERTS] = torch.cat(routed)[rev] if rev is not None else torch.cat(routed)
        if calculate_entropy:
            out[keys.ENTROPYS] = per_tok[..., 1]
        if calculate_sum_pi_squared:
            out[keys.SUM_PI_SQUARED] = per_tok[..., 2]
        return out

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
        replay = self.router_replay if keys.ROUTED_EXPERTS in mb else None
        if replay is not None:  # stays set through this micro-batch's backward (checkpointed layers re-route)
            replay.mode = "replay"
            replay.indices = from_grid(mb[keys.ROUTED_EXPERTS], mb[keys.ATTENTION_MASK], self.use_remove_padding)
        topk = self._distill is not None and is_topk_mode(self._distill["loss_mode"])
        if topk:  # the student's log-probs of the teacher's top-k support, with gradient
            out = self._topk_forward(mb, temperature, 0, mb[keys.TEACHER_TOPK_IDS], entropy_coeff != 0)
            ent, logp = out.get(keys.ENTROPYS), out[keys.OLD_LOG_PROBS]
            student_topk = mask_duplicate_ids(out["at_ids"], mb[keys.TEACHER_TOPK_IDS])
        else:
            ent, logp = self._forward_micro_batch(mb, temperature, calculate_entropy=entropy_coeff != 0)
        mask = mb[keys.RESPONSE_MASK]
        if self._bypass is not None:  # old log-probs are the rollout's: correct against the current policy here
            name = cfg.policy_loss.loss_mode
            loss_fn = compute_policy_loss_vanilla if name == "bypass_mode" else get_policy_loss_fn(name)
            (pg_loss, clipfrac, ppo_kl, clipfrac_lower), kept = bypass_policy_loss(
                loss_fn, mb[keys.OLD_LOG_PROBS], logp, mb[keys.ADVANTAGES], mask, mode, cfg, self._bypass)
        else:
            pg_loss, clipfrac, ppo_kl, clipfrac_lower = get_policy_loss_fn(cfg.policy_loss.loss_mode)(
                old_log_prob=mb[keys.OLD_LOG_PROBS], log_prob=logp, advantages=mb[keys.ADVANTAGES],
                response_mask=mask, loss_agg_mode=mode, config=cfg,
                rollout_is_weights=mb.get(keys.ROLLOUT_IS_WEIGHTS))
        loss = pg_loss
        metrics: dict[str, torch.Tensor | float] = {
            "actor/pg_loss": pg_loss.detach(), "actor/pg_clipfrac": clipfrac.detach(),
            "actor/ppo_kl": ppo_kl.detach(), "actor/pg_clipfrac_lower": clipfrac_lower.detach(),
            **log_ratio_moments(logp.detach() - mb[keys.OLD_LOG_PROBS], mask)}
        if self._bypass is not None:  # the share of response tokens the rejection dropped from the policy loss
            metrics["rollout_corr/rejected_frac"] = masked_mean(1.0 - kept.to(mask.dtype), mask.to(kept.dtype)).detach()
        if replay is not None:
            metrics.update(replay_metrics(replay, mb[keys.ATTENTION_MASK], self.use_remove_padding))
        if ent is not None:
            entropy = agg_loss(ent, mask, mode, **cfg.global_batch_info)
            loss = loss - entropy_coeff * entropy
            metrics["actor/entropy"] = entropy.detach()
        aux = self.router_aux.take() if self.router_aux is not None else None
        if aux is not None:
            loss = loss + self.router_aux.coef * aux
            metrics["actor/moe_aux_loss"] = aux.detach()
        if cfg.use_kl_loss:
            kld = kl_penalty(logp, mb[keys.REF_LOG_PROB], cfg.kl_loss_type)
            kl_loss = agg_loss(kld, mask, mode, **cfg.global_batch_info)
            loss = loss + float(cfg.kl_loss_coef) * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
            metrics["actor/kl_coef"] = float(cfg.kl_loss_coef)
        if self._distill is not None:  # on-policy distillation: towards the teacher on the student's samples
            d = self._distill
            student, teacher = (student_topk, mb[keys.TEACHER_TOPK_LOG_PROBS]) if topk else \
                (logp, mb[keys.TEACHER_LOG_PROBS])
            distill = distillation_loss(student, teacher, mask, d["loss_mode"], mode, d["log_prob_min_clamp"],
                                        d["loss_max_clamp"], loss_scale_factor=cfg.loss_scale_factor)
            loss = loss + d["coef"] * distill
            metrics["actor/distillation_loss"] = distill.detach()
        return loss, metrics

    def update_policy(self, data: Any) -> dict[str, list[float]]:
        """`ppo_epochs` passes of mini-batch optimiser steps over this rank's rows.

        Reads batch `input_ids`, `attention_mask`, `position_ids`, `responses`, `response_mask`,
        `old_log_probs`, `advantages` (+ `ref_log_prob` when use_kl_loss, + `rollout_is_weights` when
        present, + `teacher_log_probs`, or in a top-k mode `teacher_topk_ids` and `teacher_topk_log_probs`,
        with meta_info
        `distillation`: the distillation loss); meta_info
        `temperature`.

        Returns:
            metrics: name -> one value per mini-batch (actor/pg_loss, actor/grad_norm, ...).
        """
        cfg = self.config
        wanted = [*_MODEL_INPUTS, keys.RESPONSE_MASK, keys.OLD_LOG_PROBS, keys.ADVANTAGES]
        if cfg.use_kl_loss:
            wanted.append(keys.REF_LOG_PROB)
        if keys.ROLLOUT_IS_WEIGHTS in data.batch.keys():
            wanted.append(keys.ROLLOUT_IS_WEIGHTS)
        self._distill = data.meta_info.get(keys.META_DISTILLATION)
        self._bypass = data.meta_info.get(keys.META_BYPASS_CORRECTION)
        if self._distill is not None:
            wanted += [keys.TEACHER_TOPK_IDS, keys.TEACHER_TOPK_LOG_PROBS] if is_topk_mode(self._distill["loss_mode"]) \
                else [keys.TEACHER_LOG_PROBS]
        if self.router_replay is not None and keys.ROUTED_EXPERTS in data.batch.keys():
            wanted.append(keys.ROUTED_EXPERTS)
        tensors = self._with_mm_rows(data, {k: data.batch[k] for k in wanted})
        temperature = float(data.meta_info.get(keys.META_TEMPERATURE, 1.0))
        if self.sp is not None and cfg.shuffle and cfg.data_loader_seed is None:
            sync_rng(self.sp)
        try:
            return with_log_ratio_std(train_epochs(
                self.module, self.optimizer, cfg, tensors, lambda mb: self._micro_loss(mb, temperature), "actor",
                self.mini_batch_rows, cfg.data_loader_seed, sp_size=sp_size(self.sp),
                defer_grad_sync=bool(cfg.fsdp_config.use_no_sync_for_gradient_accumulation)))
        finally:
            if self.router_replay is not None:
                self.router_replay.mode = None
