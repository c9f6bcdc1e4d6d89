"""Reward managers: turn a generated batch into token-level scores. Selected by
`reward_model.reward_manager` from `REWARD_MANAGERS` (`naive`, `prime`, `batch`, `dapo`).

Every manager is called as `manager(data: DataProto, return_dict=False)` and returns a (B,R) float
tensor with each score on the last valid response token, or `{"reward_tensor", "reward_extra_info"}`.
"""

from __future__ import annotations

import abc
import functools
import inspect
import logging
import os
import time
from typing import Any, Callable

from rlpost import keys
from rlpost.reward import base
from rlpost.reward.custom import RewardFnSpec
from rlpost.utils.registry import Registry

REWARD_MANAGERS = Registry("reward_manager")
SPEC_ATTR = "rlpost_reward_fn_spec"  # where a resolved reward function carries the spec it came from
SLOW_SAMPLE_S = 0.5  # seconds per sample above which the naive manager moves to worker processes
DEFAULT_SAMPLE_TIMEOUT_S = 300.0
logger = logging.getLogger(__name__)


class AbstractRewardManager(abc.ABC):
    """Base of reward managers, as verl defines it: built with the tokenizer, the number of samples to print per
    data source, the reward function and the non-tensor key naming each row's data source; called on a batch
    (`DataProto`) it returns the (B, R) token-level scores, or with `return_dict=True` a dict of
    `reward_tensor` and `reward_extra_info` (per-row lists)."""

    @abc.abstractmethod
    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Callable | None,
                 reward_fn_key: str = keys.DATA_SOURCE, **kwargs: Any) -> None:
        """Store what scoring needs."""

    @abc.abstractmethod
    def __call__(self, data: Any, return_dict: bool = False) -> Any:
        """Score `data`."""


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(AbstractRewardManager):
    """Scores samples with `compute_score(data_source, solution_str, ground_truth, extra_info)`: one by one
    in this process while the function is fast; once a batch shows it is slow (over `SLOW_SAMPLE_S` per
    sample), the rest of that batch and every later one go to `num_processes` worker processes with a
    time-out of `timeout` seconds per sample (`reward_model.reward_kwargs.{num_processes, timeout}`;
    `compute_score_timeout` is verl's name of `timeout`)."""

    def __init__(self, tokenizer: Any, num_examine: int, spec: RewardFnSpec | Callable | None = None,
                 reward_fn_key: str = keys.DATA_SOURCE, num_processes: int | None = None,
                 timeout: float = DEFAULT_SAMPLE_TIMEOUT_S, compute_score: Callable | None = None,
                 compute_score_timeout: float | None = None, **kwargs: Any):
        if kwargs:
            raise ValueError(f"not supported yet: reward_model.reward_kwargs {sorted(kwargs)} for this manager "
                             "(accepted: num_processes, timeout, compute_score_timeout)")
        if compute_score_timeout is not None:
            if timeout not in (DEFAULT_SAMPLE_TIMEOUT_S, compute_score_timeout):
                raise ValueError(f"reward_kwargs: timeout={timeout} and compute_score_timeout={compute_score_timeout} "
                                 "are one setting; give one of them")
            timeout = compute_score_timeout
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.spec, self.compute_score = resolve_reward_fn(spec, compute_score)
        if self.spec is None and (num_processes is not None or timeout != DEFAULT_SAMPLE_TIMEOUT_S):
            raise ValueError("not supported yet: reward_model.reward_kwargs num_processes/timeout with a reward "
                             "function given as an object (worker processes rebuild it from "
                             "custom_reward_function.path/name)")
        self.reward_fn_key = reward_fn_key
        self.num_processes = num_processes or default_processes()
        self.timeout = float(timeout)
        self._parallel = False  # set for good once the function is found slow

    def score_samples(self, samples: list[base.Sample]) -> list[Any]:
        """Raw results (float or dict) of the reward function, one per sample."""
        from rlpost.reward.parallel import TIME_LIMIT_HIT, call_with_time_limit, score_in_processes  # imports us

        if self._parallel:
            return score_in_processes(self.spec, samples, self.num_processes, self.timeout, self._raw)
        results, start, timed_out = [], time.perf_counter(), set()
        for done, sample in enumerate(samples, start=1):
            raw = call_with_time_limit(self.compute_score, sample, self.timeout)
            if raw is TIME_LIMIT_HIT:
                timed_out.add(done - 1)
                logger.warning(
                    "reward function timed out after reward_model.reward_kwargs.timeout=%ss on data source %r, "
                    "sample %d (scored 0.0, counted in reward/timeout_count); response: %r",
                    self.timeout, sample.data_source, sample.index, sample.response_str[:200])
                raw = 0.0
            results.append(self._raw(raw))
            per_sample = (time.perf_counter() - start) / done
            slow = per_sample > SLOW_SAMPLE_S or timed_out
            if slow and done < len(samples) and self._can_parallelise():
                self._parallel = True
                logger.warning(
                    "the reward function takes %.2f s per sample: scoring in %d worker processes from now on, "
                    "with a time-out of reward_model.reward_kwargs.timeout=%ss per sample (time-outs score 0.0 "
                    "and are counted in reward/timeout_count); set reward_model.reward_kwargs.num_processes to "
                    "change the pool size", per_sample, self.num_processes, self.timeout)
                rest = score_in_processes(self.spec, samples[done:], self.num_processes, self.timeout, self._raw)
                return [self._with_timeout_flag(r, s, i in timed_out) for i, (r, s) in
                        enumerate(zip(results, samples))] + rest
        if timed_out:
            return [self._with_timeout_flag(r, s, i in timed_out) for i, (r, s) in enumerate(zip(results, samples))]
        return results

    plain_as: str | None = None  # also record a plain-number result under this extra key (dapo: 'acc')

    def _raw(self, result: Any) -> Any:
        """The function's result, a plain number also kept as the extra `plain_as` when the manager has one."""
        if self.plain_as is None or isinstance(result, dict):
            return result
        return {"score": result, self.plain_as: result}

    def _can_parallelise(self) -> bool:
        """Worker processes rebuild the function from its spec: only when the function in use is that one."""
        return (self.num_processes > 1 and self.spec is not None
                and _same_function(self.compute_score, self.spec.resolve()))

    @staticmethod
    def _with_timeout_flag(result: Any, sample: base.Sample, timed_out: bool = False) -> dict[str, Any]:
        """A serial result in the shape of the process pool's (so one batch has one set of extra keys)."""
        score, extra = base.split_result(result, sample)
        return {"score": score, **extra, "reward_timeout": int(timed_out)}

    def __call__(self, data: Any, return_dict: bool = False):
        """Reads `responses`, `prompts`, `attention_mask`, `response_mask`, `rm_scores` (if present)."""
        if keys.RM_SCORES in data.batch.keys():
            return base.rm_scores_passthrough(data, return_dict)
        samples = base.decode_batch(data, self.tokenizer, self.reward_fn_key)
        return base.finish(data, samples, self.score_samples(samples), self.num_examine, return_dict)


@REWARD_MANAGERS.register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """verl's manager for adv_estimator=gdpo: the naive manager, whose dict results already put each component
    (`accuracy_reward`, `format_reward`, ...) beside the `score` into the batch, where gdpo reads them."""


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(NaiveRewardManager):
    """Calls the user function once with lists: `fn(data_sources=, solution_strs=, ground_truths=,
    extra_infos=)` -> list of floats or dicts (for reward functions that batch, e.g. remote judges)."""

    def __init__(self, tokenizer: Any, num_examine: int, spec: RewardFnSpec | Callable | None = None,
                 reward_fn_key: str = keys.DATA_SOURCE, compute_score: Callable | None = None, **kwargs: Any):
        if kwargs:  # one call with all samples: there is nothing to spread over processes or time per sample
            raise ValueError(f"not supported yet: reward_model.reward_kwargs {sorted(kwargs)} for "
                             "reward_manager=batch (the function gets the whole batch in one call)")
        super().__init__(tokenizer, num_examine, spec, reward_fn_key, compute_score=compute_score)

    def score_samples(self, samples: list[base.Sample]) -> list[Any]:
        try:
            results = self.compute_score(
                data_sources=[s.data_source for s in samples],
                solution_strs=[s.response_str for s in samples],
                ground_truths=[s.ground_truth for s in samples],
                extra_infos=[s.extra_info for s in samples],
            )
        except Exception as exc:  # noqa: BLE001 - re-raised naming the batch
            import traceback

            sources = sorted({str(s.data_source) for s in samples})
            raise base.RewardFunctionError(sources, -1, f"batch call raised {exc!r}", traceback.format_exc()) from exc
        results = list(results)
        if len(results) != len(samples):
            raise base.RewardFunctionError(
                sorted({str(s.data_source) for s in samples}), -1,
                f"batch reward function returned {len(results)} scores for {len(samples)} samples",
            )
        return results


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """Naive scoring plus DAPO's soft overlong penalty: with L = max_resp_len - overlong_buffer.len,
    a response of length l > L gets `min(-(l - L) / buffer_len * penalty_factor, 0)` added. A scorer's plain number
    is also recorded as the extra value `acc` (before the penalty), as verl's dapo manager does (CoDaPO reads it)."""

    plain_as = "acc"

    def __init__(self, tokenizer: Any, num_examine: int, spec: RewardFnSpec | Callable | None = None,
                 reward_fn_key: str = keys.DATA_SOURCE, max_resp_len: int | None = None,
                 overlong_buffer_cfg: Any = None, compute_score: Callable | None = None,
                 num_processes: int | None = None, timeout: float = DEFAULT_SAMPLE_TIMEOUT_S):
        super().__init__(tokenizer, num_examine, spec, reward_fn_key, num_processes, timeout,
                         compute_score=compute_score)
        self.max_resp_len = max_resp_len
        self.buffer = overlong_buffer_cfg
        if self.buffer is not None and self.buffer.enable:
            if max_resp_len is None:
                raise ValueError("reward_model.overlong_buffer.enable=True needs data.max_response_length")
            if not 0 < int(self.buffer.len) <= int(max_resp_len):
                raise ValueError(f"reward_model.overlong_buffer.len={self.buffer.len} must be in "
                                 f"(0, data.max_response_length={max_resp_len}]")

    def __call__(self, data: Any, return_dict: bool = False):
        if keys.RM_SCORES in data.batch.keys():
            return base.rm_scores_passthrough(data, return_dict)
        samples = base.decode_batch(data, self.tokenizer, self.reward_fn_key)
        results = self.score_samples(samples)
        if self.buffer is not None and self.buffer.enable:
            results = [self._penalise(r, s) for r, s in zip(results, samples)]
        return base.finish(data, samples, results, self.num_examine, return_dict)

    def _penalise(self, result: Any, sample: base.Sample) -> dict[str, Any]:
        score, extra = base.split_result(result, sample)
        buffer_len = int(self.buffer.len)
        expected = self.max_resp_len - buffer_len
        exceed = sample.valid_response_length - expected
        penalty = min(-exceed / buffer_len * float(self.buffer.penalty_factor), 0.0)
        out = {"score": score + penalty, **extra}
        if self.buffer.log:
            out.update(overlong_reward=penalty, overlong=penalty < 0)
        return out


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> Callable:
    """Build the manager `reward.reward_manager` names (`reward_manager_class`). rlpost's managers get the reward
    function as a `RewardFnSpec` (`spec=`); a class written against verl's API (no `spec` argument, e.g. an
    `AbstractRewardManager` subclass) gets it as `compute_score=`, with `reward_fn_key` and `reward_kwargs`.

    Args:
        config: the full trainer config (`reward_model`, `custom_reward_function`, `data` groups).
        tokenizer: decodes responses.
        num_examine: samples per data source to print on each call.
        **kwargs: extra manager arguments (added to `reward_model.reward_kwargs`).
    """
    from rlpost.reward.custom import reward_fn_spec, to_plain
    from rlpost.reward.judge import generative_judge

    if generative_judge(config):  # a generative reward model: its own manager, the judge's address set later
        from rlpost.reward.judge_manager import judge_reward_manager

        return judge_reward_manager(config, tokenizer, num_examine)
    rm_cfg, data_cfg = config.reward_model, config.data
    name = rm_cfg.reward_manager if config.reward.reward_manager.source == "register" else "importlib"
    manager_kwargs = {**to_plain(rm_cfg.reward_kwargs), **kwargs, "reward_fn_key": data_cfg.reward_fn_key}
    if name != "dapo" and rm_cfg.overlong_buffer.enable:
        raise ValueError(f"reward_model.overlong_buffer.enable=True needs reward_model.reward_manager=dapo, "
                         f"got {name!r}")
    if name == "dapo":
        manager_kwargs.setdefault("max_resp_len", data_cfg.max_response_length)
        manager_kwargs.setdefault("overlong_buffer_cfg", rm_cfg.overlong_buffer)
    cls, spec = reward_manager_class(config), reward_fn_spec(config)
    if "spec" in inspect.signature(cls).parameters:
        return cls(tokenizer=tokenizer, num_examine=num_examine, spec=spec, **manager_kwargs)
    # a manager written against verl's API gets the reward function itself (its spec attached, so a subclass of
    # a built-in manager that passes it on keeps worker processes)
    fn = spec.resolve()
    setattr(fn, SPEC_ATTR, spec)
    kwargs = {"tokenizer": tokenizer, "num_examine": num_examine, "compute_score": fn, **manager_kwargs}
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"reward manager {cls.__name__} cannot be built with {', '.join(f'{k}=' for k in kwargs)} "
                         f"({exc}); give it verl's signature (tokenizer, num_examine, compute_score, reward_fn_key, "
                         "**kwargs)") from exc
    return cls(**kwargs)


def reward_manager_class(config: Any) -> type:
    """The class `reward.reward_manager` names: from the registry by `reward_model.reward_manager`
    (`source=register`), or the class `module.name` in the file `module.path` (`source=importlib`).

    Raises:
        FileNotFoundError / UserCodeError: the file is missing, does not import, or `module.name` in it is not a
            class (the message names the key).
    """
    from rlpost.utils.import_utils import UserCodeError, load_function_from_file

    ref = config.reward.reward_manager
    if ref.source != "importlib":
        return REWARD_MANAGERS.get(config.reward_model.reward_manager)
    key = "reward.reward_manager.module"
    cls = load_function_from_file(ref.module.path, ref.module.name, key)
    if not isinstance(cls, type):
        raise UserCodeError(f"{key}.name: {ref.module.name!r} in {ref.module.path} is a {type(cls).__name__}, "
                            "not a reward manager class")
    return cls


def resolve_reward_fn(spec: RewardFnSpec | Callable | None,
                      compute_score: Callable | None = None) -> tuple[RewardFnSpec | None, Callable]:
    """(spec, function) of a manager's reward function, given as rlpost's `RewardFnSpec` or, as verl's managers
    get it, a `compute_score` function (positionally or by keyword; None: the built-in scorers). A plain
    function has no spec, so it is never moved to worker processes (they rebuild the function from its spec).
    """
    if isinstance(spec, RewardFnSpec):
        if compute_score is not None:
            raise ValueError("a reward manager takes its reward function once: a spec or compute_score, not both")
        return spec, spec.resolve()
    if spec is not None and compute_score is not None:
        raise ValueError("a reward manager takes its reward function once: got it positionally and as compute_score")
    fn = spec if spec is not None else compute_score
    if fn is None:
        default = RewardFnSpec()
        return default, default.resolve()
    if not callable(fn):
        raise TypeError(f"compute_score must be a function, got {type(fn).__name__}")
    # load_reward_manager hands verl-style managers the function with its spec attached
    return getattr(fn, SPEC_ATTR, None), fn


def default_processes() -> int:
    """Reward worker processes when `reward_kwargs.num_processes` is unset: the CPU count, at most 64."""
    return min(os.cpu_count() or 1, 64)


def _same_function(a: Any, b: Any) -> bool:
    """Whether two resolved reward functions are the same (`functools.partial` compares by parts)."""
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return a.func is b.func and a.args == b.args and a.keywords == b.keywords
    return a is b
