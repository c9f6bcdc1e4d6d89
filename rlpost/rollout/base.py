"""The rollout interface shared by every engine, and the sampling settings they all read.

An engine receives one row per sample: the trainer has already repeated each prompt `rollout.n` times
(and `val_kwargs.n` times for validation), keeping `uid`, so an engine always samples exactly ONE response
per row. `rollout.n` is therefore never read here.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, TypeVar

from rlpost import keys

if TYPE_CHECKING:
    import torch

    from rlpost.protocol import DataProto
    from rlpost.rollout.async_engine import AgentEngine

T = TypeVar("T")


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
    """Merge the rollout config, `val_kwargs` (when meta_info["validate"]) and meta_info overrides.

    meta_info `do_sample=False` forces greedy; meta_info `temperature` overrides the config value.
    """
    if meta_info.get(keys.META_VALIDATE, False):
        val = config.val_kwargs
        do_sample, temperature, top_k, top_p = bool(val.do_sample), float(val.temperature), val.top_k, val.top_p
    else:
        do_sample = config.do_sample
        temperature = float(meta_info.get(keys.META_TEMPERATURE, config.temperature))
        top_k, top_p = config.top_k, config.top_p
    if keys.META_DO_SAMPLE in meta_info:  # the caller may only turn sampling off, never on
        do_sample = do_sample and bool(meta_info[keys.META_DO_SAMPLE])
    return SamplingSpec(
        greedy=(not do_sample) or temperature <= 0.0,
        temperature=temperature,
        top_k=int(top_k),
        top_p=float(top_p),
        max_tokens=config.response_length,
        ignore_eos=config.ignore_eos,
        logprobs=config.calculate_log_probs,
    )


class BaseRollout(abc.ABC):
    """A generation engine living inside the actor/rollout worker process.

    Attributes:
        agent_tp_mode: how the tensor-parallel peers of one engine take part in multi-turn rollouts
            (`rlpost.workers.agent_rollout.AgentRollout.generate_in_block`): "lockstep" (each rank calls its
            engine SPMD; the peers replay the first rank's engine calls), "owner" (the first rank's engine runs
            the block's TP workers itself) or None (no tensor parallelism with agent loops).
        last_sync_s: seconds the last `update_weights` took (the worker reports it as
            `timing_s/update_weights`); 0.0 before the first sync.
        needs_sync: True while the engine holds no valid weights (vLLM after a level-2 sleep): the
            worker must call `update_weights` before the next generation.
    """

    last_sync_s: float = 0.0
    needs_sync: bool = False
    agent_tp_mode: str | None = None

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

    def load_adapter(self, path: str) -> None:
        """Serve the PEFT adapter folder `path` (LoRA with `model.lora.merge=false`) from the next generation on.

        Raises:
            NotImplementedError: this engine cannot serve an adapter.
        """
        raise NotImplementedError(f"not supported yet: actor_rollout_ref.model.lora.merge=false with the "
                                  f"{type(self).__name__} engine (it cannot serve a LoRA adapter); set "
                                  "actor_rollout_ref.model.lora.merge=true (full weights are synced instead)")

    def load_adapter_tensors(self, tensors: dict[str, torch.Tensor], peft_config: Any) -> bool:
        """Serve the adapter `tensors` (PEFT's saved names) with its `peft.LoraConfig`, handed over in memory, from
        the next generation on; the engine may keep and modify the tensors.

        Returns:
            False when this engine takes adapters only from folders (`load_adapter`): nothing was loaded.
        """
        return False

    def agent_engine(self, stop_ids: set[int]) -> AgentEngine:
        """The async `generate` the agent loops of a multi-turn rollout call (`rlpost.rollout.async_engine`),
        stopping at `stop_ids`; built per `generate_sequences` call.

        Raises:
            NotImplementedError: this engine has no multi-turn front.
        """
        # Start-up validation refuses this combination first; this guards direct (non-main_ppo) use.
        raise NotImplementedError(f"not supported yet: actor_rollout_ref.rollout.multi_turn.enable=true with the "
                                  f"{type(self).__name__} engine; use actor_rollout_ref.rollout.name=vllm, sglang "
                                  "or hf")

    def run_coroutine(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run the agent loops of one `generate_sequences` call (`coroutine`) to the end on the event loop this
        engine's agent front needs: a fresh one by default; an engine bound to a loop of its own overrides."""
        return asyncio.run(coroutine)

    def sleep(self) -> None:
        """Release generation memory (KV cache; on GPU also weights) while the actor trains."""

    def wake_up(self) -> None:
        """Re-acquire what `sleep` released, before the next sync/generation."""
