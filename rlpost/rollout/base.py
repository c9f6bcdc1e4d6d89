"""The rollout interface shared by every engine, and the sampling settings they all read.

An engine receives one row per sample: the trainer has already repeated each prompt `rollout.n` times
(and `val_kwargs.n` times for validation), keeping `uid`, so an engine always samples exactly ONE response
per row. `rollout.n` is therefore never read here.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from rlpost import keys

if TYPE_CHECKING:
    import torch

    from rlpost.protocol import DataProto

_MISSING = object()


def cfg_get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """Read `a.b.c` from a DictConfig, dict or attribute object; `default` when absent or None."""
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        if hasattr(node, "get") and not isinstance(node, type):
            try:
                node = node.get(part, _MISSING)
            except Exception:  # noqa: BLE001 - structured configs raise on unknown keys
                node = getattr(node, part, _MISSING)
        else:
            node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return default
    return default if node is None else node


def check_unsupported(config: Any) -> None:
    """Refuse rollout options that are in scope but not built yet, instead of ignoring them.

    Raises:
        NotImplementedError: naming the key, when it is set away from its default.
    """
    if cfg_get(config, "use_fire_sampling", False):
        raise NotImplementedError(
            "not supported yet: actor_rollout_ref.rollout.use_fire_sampling=True (set it to False)"
        )
    if cfg_get(config, "multi_turn.enable", False):
        raise NotImplementedError(
            "not supported yet: actor_rollout_ref.rollout.multi_turn.enable=True (set it to False)"
        )


@dataclass(frozen=True)
class SamplingSpec:
    """Engine-neutral sampling settings for one `generate_sequences` call.

    `greedy` is True for do_sample=False or temperature 0; engines then decode greedily and ignore
    temperature/top_k/top_p. `top_k` <= 0 means disabled (each engine maps it to its own "off" value).
    """

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    max_tokens: int
    ignore_eos: bool
    logprobs: bool


def resolve_sampling(config: Any, meta_info: dict) -> SamplingSpec:
    """Merge rollout config, `val_kwargs` (when meta_info["validate"]) and meta_info overrides.

    meta_info `do_sample=False` forces greedy; meta_info `temperature` overrides the config value.
    """
    validate = bool(meta_info.get(keys.META_VALIDATE, False))
    if validate:  # validation defaults are greedy, as in verl's val_kwargs
        do_sample = bool(cfg_get(config, "val_kwargs.do_sample", False))
        temperature = float(cfg_get(config, "val_kwargs.temperature", 0.0))
        top_k = int(cfg_get(config, "val_kwargs.top_k", -1))
        top_p = float(cfg_get(config, "val_kwargs.top_p", 1.0))
    else:
        do_sample = bool(cfg_get(config, "do_sample", True))
        temperature = float(meta_info.get(keys.META_TEMPERATURE, cfg_get(config, "temperature", 1.0)))
        top_k = int(cfg_get(config, "top_k", -1))
        top_p = float(cfg_get(config, "top_p", 1.0))
    if keys.META_DO_SAMPLE in meta_info:  # the caller may only turn sampling off, never on
        do_sample = do_sample and bool(meta_info[keys.META_DO_SAMPLE])
    response_length = cfg_get(config, "response_length")
    if response_length is None:
        raise ValueError("actor_rollout_ref.rollout.response_length must be set (defaults to data.max_response_length)")
    return SamplingSpec(
        greedy=(not do_sample) or temperature <= 0.0,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_tokens=int(response_length),
        ignore_eos=bool(cfg_get(config, "ignore_eos", False)),
        logprobs=bool(cfg_get(config, "calculate_log_probs", False)),
    )


class BaseRollout(abc.ABC):
    """A generation engine living inside the actor/rollout worker process.

    Attributes:
        last_sync_s: seconds the last `update_weights` took (the worker reports it as
            `timing_s/update_weights`); 0.0 before the first sync.
        needs_sync: True while the engine holds no valid weights (vLLM after a level-2 sleep): the
            worker must call `update_weights` before the next generation.
    """

    last_sync_s: float = 0.0
    needs_sync: bool = False

    @abc.abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample one response per row.

        Reads batch `input_ids` (B,P) left-padded, `attention_mask` (B,P), `position_ids` (B,P);
        non-tensor `raw_prompt_ids` if present; meta_info `eos_token_id`, `pad_token_id`, `validate`,
        `do_sample`. Writes `prompts` (B,P), `responses` (B,R), `input_ids`/`attention_mask`/
        `position_ids` (B,P+R), `response_mask` (B,R), and `rollout_log_probs` (B,R) when
        `calculate_log_probs`; non-tensor fields are carried through unchanged.
        """

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full (unsharded) tensors with HF names into the engine, in place, one at a time.

        May be called while the engine sleeps: it wakes what the load needs (the KV cache may stay
        released until `wake_up`)."""

    def sleep(self) -> None:
        """Release generation memory (KV cache; on GPU also weights) while the actor trains."""

    def wake_up(self) -> None:
        """Re-acquire what `sleep` released, before the next sync/generation."""
