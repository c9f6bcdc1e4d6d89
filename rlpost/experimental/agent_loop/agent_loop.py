"""Agent loops written against verl's `AgentLoopBase` run unchanged in rlpost's multi-turn rollout.

A loop subclasses this module's `AgentLoopBase`, is registered with `@register(name)` and listed in
`actor_rollout_ref.rollout.agent.agent_loop_config_path` (`name` + `_target_`), and implements

    async def run(self, sampling_params: dict, **kwargs) -> AgentLoopOutput

`kwargs` are the row's fields (`raw_prompt`, `extra_info`, `tools_kwargs`, `index`, ...). The loop has verl's
attributes:

    self.config            read-only view: `actor_rollout_ref.*` (the rollout worker's group) and
                           `data.{max_prompt_length, max_response_length, apply_chat_template_kwargs}`
    self.rollout_config    self.config.actor_rollout_ref.rollout;  self.data_config: self.config.data
    self.server_manager    `await generate(request_id, prompt_ids=, sampling_params=) -> TokenOutput`
    self.tokenizer, self.processor (None: text only), self.dataset_cls, self.loop (the running event loop)
    self.apply_chat_template_kwargs, self.system_prompt (ids of the template's bare system turn)
    await self.apply_chat_template(messages, tools=None, remove_system_prompt=False) -> prompt ids

and verl's older class hook `init_class(config, tokenizer, processor, **kwargs)`, called as each instance is
built (the override guards itself with `cls._class_initialized`, as in verl).

What a loop returns is padded like any rlpost trajectory (`rlpost.agent.collate`); its `metrics`
(`AgentLoopMetrics`: seconds spent generating / in tools) are logged as `multi_turn/generate_s/mean` and
`multi_turn/tool_calls_s/mean`. Images, videos and MoE router replay are not supported yet: a loop that
passes them gets an error naming them.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from rlpost.agent import base as _base
from rlpost.agent.trajectory import encode, render

register = _base.register

# verl's per-trajectory timings, renamed so they cannot be read as rlpost's counters (`tool_calls` is a count)
_VERL_METRIC_NAMES = {"generate_sequences": "generate_s", "tool_calls": "tool_calls_s",
                      "compute_score": "compute_score_s", "num_preempted": "num_preempted"}
# sampling keys verl passes that change nothing at these values
_NEUTRAL_SAMPLING = {"repetition_penalty": 1.0}
# the sampling keys rlpost's engines take (rlpost.rollout.base.SamplingSpec) and the caller's budget
_ENGINE_SAMPLING = frozenset({"greedy", "temperature", "top_k", "top_p", "ignore_eos", "logprobs", "max_tokens",
                              "max_new_tokens"})


@dataclass
class TokenOutput:
    """One engine answer: the sampled ids (ending with EOS when generation stopped on it) and their
    log-probs (None unless `rollout.calculate_log_probs`)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentLoopMetrics:
    """verl's per-trajectory timings (seconds) and the engine's preemption count (-1: unknown)."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1


@dataclass
class AgentLoopOutput(_base.AgentLoopOutput):
    """verl's trajectory output (fields as `rlpost.agent.base.AgentLoopOutput`, plus verl's multi-modal and
    router-replay fields, which must stay empty). `metrics` may be an `AgentLoopMetrics` or a dict of its
    field names."""

    routed_experts: Any = None
    multi_modal_data: dict | None = None
    mm_processor_kwargs: dict | None = None
    mm_processor_output: list | None = None

    def __post_init__(self) -> None:
        for name in ("routed_experts", "multi_modal_data", "mm_processor_kwargs", "mm_processor_output"):
            value = getattr(self, name)
            if value is not None and not (hasattr(value, "__len__") and len(value) == 0):
                raise ValueError(f"not supported yet: AgentLoopOutput.{name} (rlpost's agent loops are text only)")
        metrics = self.metrics
        if isinstance(metrics, AgentLoopMetrics):
            metrics = dataclasses.asdict(metrics)
        self.metrics = {_VERL_METRIC_NAMES.get(k, k): float(v) for k, v in dict(metrics or {}).items()}

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (as pydantic's model_dump gives verl's): lists and dicts copied, so changing the
        result leaves the output as it was."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}


class AsyncLLMServerManager:
    """verl's handle on the inference servers; here, rlpost's in-process engine front.

    Args:
        generate: the engine contract of `rlpost.agent.base` (`GenerateFn`).
        context_length: prompt + response length the engine holds (data.max_prompt_length + max_response_length).
    """

    def __init__(self, generate: _base.GenerateFn, context_length: int) -> None:
        self._generate = generate
        self.context_length = int(context_length)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, **kwargs: Any) -> TokenOutput:
        """Sample a continuation of `prompt_ids`: at most `sampling_params["max_tokens"]` (or
        `max_new_tokens`) new tokens, and never more than the engine's context leaves.

        Raises:
            ValueError: multi-modal data or other extra arguments (not supported yet); sampling keys rlpost's
                engines do not have; a conversation that leaves no room for one more token.
        """
        extra = {k: v for k, v in {"image_data": image_data, "video_data": video_data, "audio_data": audio_data,
                                   "mm_processor_kwargs": mm_processor_kwargs, **kwargs}.items() if v}
        if extra:
            raise ValueError(f"not supported yet: generate({', '.join(sorted(extra))}=...) in agent loops")
        params = dict(sampling_params)
        for key, neutral in _NEUTRAL_SAMPLING.items():
            if params.get(key, neutral) != neutral:
                raise ValueError(f"not supported yet: sampling_params[{key!r}]={params[key]!r} (only {neutral})")
            params.pop(key, None)
        unknown = sorted(set(params) - _ENGINE_SAMPLING)
        if unknown:
            raise ValueError(f"not supported yet: sampling_params {unknown} (rlpost's engines take "
                             f"{sorted(_ENGINE_SAMPLING)})")
        asked = params.pop("max_new_tokens", None)
        asked = params.get("max_tokens", asked)
        room = self.context_length - len(prompt_ids)
        max_tokens = room if asked is None else min(int(asked), room)
        if max_tokens < 1:
            raise ValueError(f"request {request_id}: a conversation of {len(prompt_ids)} tokens leaves no room in "
                             f"the engine's {self.context_length} (data.max_prompt_length + "
                             "data.max_response_length); end the loop before the budget is spent")
        token_ids, log_probs = await self._generate(list(prompt_ids), {**params, "max_tokens": max_tokens})
        return TokenOutput(token_ids=[int(t) for t in token_ids],
                           log_probs=None if log_probs is None else [float(x) for x in log_probs],
                           stop_reason="completed")


LLMServerClient = AsyncLLMServerManager  # verl's newer name


class AgentLoopBase(_base.AgentLoopBase):
    """Base of agent loops written against verl (attributes in the module docstring).

    Args:
        context: rlpost's per-call context; its `trainer_config` is the loop's `self.config`.
        **kwargs: extra keys of the loop's entry in `agent_loop_config_path`.
    """

    _class_initialized = False

    def __init__(self, context: _base.AgentLoopContext, **kwargs: Any) -> None:
        # not rlpost's base __init__: its `self.config`/`self.tools` would hide what verl loops set on the class
        if context.trainer_config is None:
            raise RuntimeError(f"{type(self).__name__} is written against verl's AgentLoopBase and needs the trainer "
                               "view that rlpost's multi-turn rollout passes (run_agent_loops(trainer_config=))")
        self.context, self.kwargs = context, kwargs
        type(self).init_class(context.trainer_config, context.tokenizer, None, **kwargs)
        self.config = context.trainer_config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.data_config = self.config.data
        self.tokenizer = context.tokenizer
        self.processor = None
        self.server_manager = AsyncLLMServerManager(
            context.generate, int(self.data_config.max_prompt_length) + int(self.data_config.max_response_length))
        self.loop = asyncio.get_running_loop()
        self.apply_chat_template_kwargs = dict(self.data_config.get("apply_chat_template_kwargs") or {})

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
        """verl's once-per-class set-up hook; overrides store shared settings on `cls`."""
        cls._class_initialized = True

    @property
    def dataset_cls(self) -> type:
        from rlpost.data.rl_dataset import RLHFDataset

        return RLHFDataset

    @functools.cached_property
    def system_prompt(self) -> list[int]:
        """Ids of what the chat template writes for an empty conversation (its default system turn), which
        `apply_chat_template(remove_system_prompt=True)` strips."""
        try:
            text = render(self.tokenizer, [{}], None, False, self.apply_chat_template_kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised naming what was asked
            raise ValueError("remove_system_prompt=True needs a chat template that renders an empty message "
                             f"(its default system turn); this one raised {exc!r}") from exc
        return encode(self.tokenizer, text)

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None, images: Any = None,
                                  videos: Any = None, remove_system_prompt: bool = False) -> list[int]:
        """Ids of `messages` rendered with the chat template and the generation prompt; with
        `remove_system_prompt`, without the template's default system turn (for turns appended to a
        conversation)."""
        if images or videos:
            raise ValueError("not supported yet: images and videos in agent loops")
        ids = encode(self.tokenizer, render(self.tokenizer, list(messages), tools, True,
                                            self.apply_chat_template_kwargs))
        return ids[len(self.system_prompt):] if remove_system_prompt else ids

    async def process_vision_info(self, messages: list[dict]) -> dict:
        """{} for text conversations; images and videos are not supported yet."""
        for message in messages:
            content = message.get("content")
            if isinstance(content, list) and any(part.get("type") in ("image", "video") for part in content
                                                 if isinstance(part, dict)):
                raise ValueError("not supported yet: images and videos in agent loops")
        return {}
