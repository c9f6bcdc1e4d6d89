"""Typed `reward_model.judge` group: a generative reward model (an LLM judge) served by vLLM in its own pool or at
an OpenAI-compatible URL. The YAML (`reward_model/dp_reward_model.yaml`) holds the defaults and what each key means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from rlpost.config.base import BaseConfig
from rlpost.config.constraints import NON_NEGATIVE, POSITIVE, POSITIVE_FLOAT


@dataclass(frozen=True)
class JudgeConfig(BaseConfig):
    """`reward_model.judge`: where the judge is, how a request is written and how its verdict becomes a score."""

    enable: bool
    url: str | None
    model_name: str | None
    api: str
    max_concurrency: Annotated[int, POSITIVE]
    timeout_s: Annotated[float, POSITIVE_FLOAT]
    prompt_template: str
    system_prompt: str | None
    parser: str
    pattern: str
    json_key: str
    max_score: float | None
    failure_score: float
    max_tokens: Annotated[int, POSITIVE]
    temperature: Annotated[float, NON_NEGATIVE]
    top_p: float
