"""Multi-turn rollouts inside the rollout worker (`rollout.multi_turn.enable=true`).

Each row of a `generate_sequences` call runs its agent loop (`rlpost.agent`: `tool_agent`,
`single_turn_agent` or a user loop, by the row's `agent_name`); all of this rank's trajectories run at once
on one asyncio event loop, and their engine requests go to the rollout's agent front
(`BaseRollout.agent_engine`: continuous batching on vLLM, batched `generate` on HF). The result has the
single-turn batch fields, so the trainer treats both alike:

    prompts (B, P), responses (B, R), input_ids / attention_mask / position_ids (B, P+R)
    response_mask (B, R)       1 on the model's tokens, 0 on tool and user tokens
    rollout_log_probs (B, R)   with rollout.calculate_log_probs (0 on tool and user tokens)

plus per-row fields: `__num_turns__`, `agent_metrics` (the trajectory's counters, summed up as the
`multi_turn/*` step metrics by the trainer), `tool_rewards`, `turn_scores`; and `rm_scores` when every
loop scored its own trajectory. P = data.max_prompt_length, R = data.max_response_length (all turns).

With tensor parallelism (`generate_in_block`) only the block's first rank runs agent loops, for the rows of
the whole block; how its peers take part depends on the engine (`BaseRollout.agent_tp_mode`):

- "lockstep" (vLLM `external_launcher`: every TP rank holds a shard and calls its engine SPMD): the first
  rank drives its engine through `rlpost.rollout.lockstep.LockstepDriver`, the peers replay each of its
  engine calls (`follow`), so all shards see identical adds, aborts and steps.
- "owner" (SGLang: the first rank's engine runs the block's TP schedulers itself): the peers wait.

Then the first rank broadcasts the block's batch and every rank keeps its own rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from rlpost import keys
from rlpost.agent import AgentLoopConfig, AgentLoopOutput, AgentResources, collate_agent_outputs, run_agent_loops
from rlpost.config.base import to_plain
from rlpost.protocol import DataProto
from rlpost.rollout.async_engine import AgentEngine, sampling_kwargs
from rlpost.rollout.over_sample import OverSampled, groups_to_keep
from rlpost.rollout.base import BaseRollout, resolve_sampling
from rlpost.rollout.lockstep import GroupChannel, LockstepDriver, follow
from rlpost.rollout.utils import eos_id_set
from rlpost.workers.batching import group_rows, own_rows


class AgentRollout:
    """The agent loops of one rollout worker.

    Args:
        rollout_config: `actor_rollout_ref.rollout` (multi_turn.*, agent.*, prompt_length, response_length).
        tokenizer: the policy tokenizer with its chat template.
        arr_config: the worker's whole `actor_rollout_ref` group, shown to agent loops written against verl
            (their `self.config`); None: the rollout group alone.

    Tools, interactions and the user agent loops of `agent.agent_loop_config_path` load here, once per worker.
    """

    def __init__(self, rollout_config: Any, tokenizer: Any, arr_config: Any = None) -> None:
        self.rollout_config, self.tokenizer = rollout_config, tokenizer
        self.arr_config = arr_config
        self._views: dict[str, Any] = {}  # trainer views by their chat-template kwargs
        self.config = AgentLoopConfig.from_rollout_config(rollout_config)
        self.resources = AgentResources.from_config(self.config)
        self.prompt_length = int(rollout_config.prompt_length)
        self.response_length = int(rollout_config.response_length)

    def generate_in_block(self, rollout: BaseRollout, prompts: DataProto, group: Any, tp_rank: int) -> DataProto:
        """`generate_sequences` for a tensor-parallel block (see the module docstring): the block's rows run on
        its first rank, the result is broadcast and each rank gets its own rows back. `group` None (TP 1):
        this rank's rows on its own engine.

        Raises:
            RuntimeError: on the peers, when the first rank failed (its own error is raised there).
            NotImplementedError: the engine has no tensor-parallel multi-turn mode.
        """
        if group is None:
            return self.generate_sequences(rollout, prompts)
        import torch.distributed as dist

        mode = rollout.agent_tp_mode
        if mode not in ("lockstep", "owner"):
            raise NotImplementedError(
                f"not supported yet: actor_rollout_ref.rollout.tensor_model_parallel_size="
                f"{dist.get_world_size(group)} with actor_rollout_ref.rollout.multi_turn.enable=true on the "
                f"{type(rollout).__name__} engine; set actor_rollout_ref.rollout.tensor_model_parallel_size=1")
        rows, start = group_rows(prompts, group, tp_rank)
        src = dist.get_rank() - tp_rank
        channel = GroupChannel(group, src)
        result: list[Any] = [None]
        failure: BaseException | None = None
        try:
            if tp_rank == 0:
                wrap = (lambda engine: LockstepDriver(engine, channel)) if mode == "lockstep" else None
                result = [self.generate_sequences(rollout, rows, wrap=wrap)]
            elif mode == "lockstep":
                follow(rollout.agent_engine(eos_id_set(rows.meta_info.get(keys.META_EOS_TOKEN_ID))), channel)
        except Exception as err:  # noqa: BLE001  (every rank must still join the broadcast below)
            failure = err
            result = [f"{type(err).__name__}: {err}"]
        dist.broadcast_object_list(result, src=src, group=group)
        if failure is not None:
            raise failure
        if isinstance(result[0], str):
            raise RuntimeError(f"multi-turn rollout failed on the first rank of this tensor-parallel block "
                               f"(rank {src}): {result[0]}")
        return own_rows(result[0], start, len(prompts))

    def generate_sequences(self, rollout: BaseRollout, prompts: DataProto, wrap: Any = None) -> DataProto:
        """One trajectory per row of `prompts`; `wrap` (optional) wraps the rollout's agent front (e.g. a
        `LockstepDriver`).

        Reads non-tensor `raw_prompt` (and `raw_prompt_ids`, `agent_name`, `tools_kwargs`, `interaction_kwargs`
        when present); meta_info `eos_token_id`, `pad_token_id`, `validate`, `do_sample`, `chat_template_kwargs`.
        Writes the fields of the module docstring; the input's non-tensor fields and meta_info carried through.
        """
        meta = prompts.meta_info
        spec = resolve_sampling(self.rollout_config, meta)
        pad_id = int(meta.get(keys.META_PAD_TOKEN_ID) or 0)
        config = dataclasses.replace(self.config, template_kwargs=dict(meta.get(keys.META_CHAT_TEMPLATE_KWARGS) or {}))
        engine = rollout.agent_engine(eos_id_set(meta.get(keys.META_EOS_TOKEN_ID)))
        if wrap is not None:
            engine = wrap(engine)
        rows = [{k: v[i] for k, v in prompts.non_tensor_batch.items()} for i in range(len(prompts))]
        # rollout.over_sample_rate (training batches): the slowest groups' trajectories are cancelled
        rate = 0.0 if meta.get(keys.META_VALIDATE) else float(self.rollout_config.over_sample_rate)
        first = None
        if rate > 0:
            uids = list(prompts.non_tensor_batch[keys.UID])
            first = (uids, groups_to_keep(len(set(uids)), rate))
        outputs = rollout.run_coroutine(self._run(rows, engine, config, sampling_kwargs(spec), first))
        cut = None
        if first is not None:  # cut rows: an empty trajectory, dropped by the trainer with the flags below
            cut = outputs
            outputs = [placeholder_output(cut.results) if o is None else o for o in cut.results]
        tensors = collate_agent_outputs(outputs, self.prompt_length, self.response_length, pad_id)
        if not spec.logprobs:
            tensors.pop(keys.ROLLOUT_LOG_PROBS, None)
        elif keys.ROLLOUT_LOG_PROBS not in tensors:
            raise RuntimeError("rollout.calculate_log_probs=true, but an agent loop returned no log-probs")
        scores = self_scored(outputs, tensors[keys.ATTENTION_MASK][:, -self.response_length:])
        if scores is not None:
            tensors[keys.RM_SCORES] = scores
        non_tensors = {**prompts.non_tensor_batch, **_row_fields(outputs)}
        if cut is not None:
            non_tensors[keys.OVER_SAMPLE_CUT] = np.array(cut.cut, dtype=bool)
            non_tensors[keys.OVER_SAMPLE_ABORTED] = np.array(cut.aborted, dtype=bool)
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(meta))

    def trainer_view(self, config: AgentLoopConfig) -> Any:
        """What a loop written against verl reads as `self.config`: read-only `actor_rollout_ref` (the worker's
        group) and the `data` keys a rollout knows (lengths, chat-template arguments)."""
        import json

        from omegaconf import DictConfig, OmegaConf

        cache_key = json.dumps(config.template_kwargs, sort_keys=True, default=str)
        if cache_key in self._views:
            return self._views[cache_key]

        def plain(cfg: Any) -> dict:
            return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else to_plain(cfg)

        arr = plain(self.arr_config) if self.arr_config is not None else {"rollout": plain(self.rollout_config)}
        data = {"max_prompt_length": self.prompt_length, "max_response_length": self.response_length,
                "apply_chat_template_kwargs": dict(config.template_kwargs), "return_raw_chat": True}
        view = OmegaConf.create({"actor_rollout_ref": arr, "data": data}, flags={"readonly": True})
        self._views[cache_key] = view
        return view

    async def _run(self, rows: list[dict], engine: AgentEngine, config: AgentLoopConfig,
                   params: dict[str, Any], first_groups: tuple[list, int] | None = None
                   ) -> list[AgentLoopOutput] | OverSampled:
        limit = self.prompt_length + self.response_length

        async def generate(prompt_ids: list[int], sampling_params: dict[str, Any]):
            # the engine's context is prompt + response length: only a prompt longer than P can exceed it
            if len(prompt_ids) + int(sampling_params["max_tokens"]) > limit:
                raise ValueError(f"a conversation of {len(prompt_ids)} tokens does not fit the engine's "
                                 f"{limit} (data.max_prompt_length + data.max_response_length): its prompt is longer "
                                 f"than data.max_prompt_length={self.prompt_length} once rendered for the agent loop "
                                 "(tool schemas included); raise data.max_prompt_length")
            return await engine.generate(prompt_ids, sampling_params)

        try:
            return await run_agent_loops(rows, generate, config, self.tokenizer, params, self.resources,
                                         trainer_config=self.trainer_view(config), first_groups=first_groups)
        finally:
            await engine.close()


def placeholder_output(results: list[AgentLoopOutput | None]) -> AgentLoopOutput:
    """The row of a group the over-sampling cut: one pad-free prompt token of a kept row, no response, and the
    kept rows' score convention (0.0 when they score themselves), so the batch collates; the trainer drops it."""
    kept = next(o for o in results if o is not None)
    return AgentLoopOutput(prompt_ids=kept.prompt_ids[:1], response_ids=[], response_mask=[],
                           response_logprobs=None if kept.response_logprobs is None else [],
                           reward_score=None if kept.reward_score is None else 0.0)


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _row_fields(outputs: list[AgentLoopOutput]) -> dict[str, np.ndarray]:
    return {
        keys.NUM_TURNS: np.array([o.num_turns for o in outputs], dtype=np.int64),
        keys.AGENT_METRICS: _objects([dict(o.metrics) for o in outputs]),
        keys.TOOL_REWARDS: _objects([dict(o.extra_fields.get("tool_rewards") or {}) for o in outputs]),
        keys.TURN_SCORES: _objects([list(o.extra_fields.get("turn_scores") or []) for o in outputs]),
    }


def self_scored(outputs: list[AgentLoopOutput], response_attention: torch.Tensor) -> torch.Tensor | None:
    """`rm_scores` (B, R) from the loops' own `reward_score`s, placed on each row's last response token;
    None when no loop scored. The reward managers then pass these scores through.

    Raises:
        ValueError: some trajectories carry a score and others do not.
    """
    given = [o.reward_score is not None for o in outputs]
    if not any(given):
        return None
    if not all(given):
        raise ValueError(f"{sum(given)} of {len(outputs)} agent-loop outputs carry a reward_score: either every "
                         "loop scores its trajectory or none does (the reward function scores the rest)")
    scores = torch.zeros(response_attention.shape, dtype=torch.float32)
    last = (response_attention.sum(-1) - 1).clamp(min=0)
    scores[torch.arange(len(outputs)), last] = torch.tensor([float(o.reward_score) for o in outputs])
    return scores
