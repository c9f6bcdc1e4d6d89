"""Load the reward function: a user file (`custom_reward_function.*`) or the built-in scorers.

`RewardFnSpec` is a picklable description (path, name, kwargs) so process pools can rebuild the
function in the child instead of pickling a function object loaded from an arbitrary file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from rlpost.reward.score import default_compute_score
from rlpost.utils.import_utils import UserCodeError, load_function_from_file

__all__ = ["DEFAULT_FUNCTION_NAME", "RewardFnSpec", "UserCodeError", "get_custom_reward_fn", "load_function_from_file",
           "reward_fn_spec", "to_plain"]

DEFAULT_FUNCTION_NAME = "compute_score"


@dataclass(frozen=True)
class RewardFnSpec:
    """Where a reward function comes from. `path=None` means the built-in `default_compute_score`."""

    path: str | None = None
    name: str = DEFAULT_FUNCTION_NAME
    kwargs: dict[str, Any] = field(default_factory=dict)

    def resolve(self) -> Callable[..., Any]:
        """The function with `kwargs` bound (`compute_score(data_source, solution_str, ground_truth,
        extra_info=None, **kwargs)`)."""
        fn = default_compute_score if self.path is None else load_function_from_file(self.path, self.name)
        return functools.partial(fn, **self.kwargs) if self.kwargs else fn

    def __hash__(self) -> int:  # kwargs is a dict; hash the rest
        return hash((self.path, self.name))


def reward_fn_spec(config: Any) -> RewardFnSpec:
    """Build the spec from the full config's `custom_reward_function` group (path null: the built-in scorer)."""
    group = config.custom_reward_function
    path, name = group.path, group.name
    # ppo_trainer.yaml lists example kwargs as null: a null entry means "not passed".
    kwargs = {k: v for k, v in to_plain(group.reward_kwargs).items() if v is not None}
    if path is None and name != DEFAULT_FUNCTION_NAME:
        raise ValueError(
            f"custom_reward_function.name={name!r} is set but custom_reward_function.path is null; "
            "set the path of the file that defines it"
        )
    if path is None:
        kwargs.update(builtin_scorer_kwargs(config))
    return RewardFnSpec(path=str(path) if path else None, name=name, kwargs=kwargs)


def builtin_scorer_kwargs(config: Any) -> dict[str, Any]:
    """What verl hands its built-in scorers: the sandbox (url, memory limit, a limit on programs in flight shared
    by every process) when `reward_model.sandbox_fusion.url` is set, plus `reward.compute_score_kwargs`."""
    from omegaconf import OmegaConf

    from rlpost.config.base import BaseConfig
    from rlpost.sandbox import LOCAL
    from rlpost.sandbox.client import SandboxSlots

    def select(key: str) -> Any:  # the typed trainer config, or a DictConfig (the evaluation config lacks groups)
        return config.select(key) if isinstance(config, BaseConfig) else OmegaConf.select(config, key)

    extra = select("reward.compute_score_kwargs")
    out = to_plain(extra) if extra else {}
    sandbox = select("reward_model.sandbox_fusion")
    if sandbox is not None and sandbox.url and sandbox.url != LOCAL:  # local: replaced by the service's address
        out.update(sandbox_fusion_url=sandbox.url, memory_limit_mb=int(sandbox.memory_limit_mb),
                   concurrent_semaphore=SandboxSlots(int(sandbox.max_concurrent), sandbox.url))
    return out


def get_custom_reward_fn(config: Any) -> Callable[..., Any] | None:
    """verl-compatible helper: the user function with `reward_kwargs` bound, or None without a path."""
    spec = reward_fn_spec(config)
    return spec.resolve() if spec.path else None


def to_plain(obj: Any) -> dict[str, Any]:
    """A free-form mapping of the config (DictConfig or dict) as a plain dict."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(obj, resolve=True) if OmegaConf.is_config(obj) else dict(obj)
