"""Shared pieces of the reward managers: decoding a batch, checking scores, placing them on tokens."""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from rlpost import keys


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned a non-finite score; names the sample, keeps the traceback."""

    def __init__(self, data_source: Any, index: int, reason: str, tb: str = ""):
        self.data_source = data_source
        self.index = index
        self.reason = reason
        self.traceback_str = tb
        detail = f"\n--- reward function traceback ---\n{tb}" if tb else ""
        super().__init__(f"reward function failed for data_source={data_source!r}, sample {index}: {reason}{detail}")


@dataclass
class Sample:
    """One decoded response and what its reward function needs."""

    index: int
    data_source: Any
    prompt_str: str
    response_str: str
    ground_truth: Any
    extra_info: Any
    valid_response_length: int
    row: Any = None  # the prompt's row in its data file (the batch's `index`), when known


def response_lengths(data: Any) -> torch.Tensor:
    """Real response tokens per row, (B,): the response part of `attention_mask`, else `response_mask`.

    In a multi-turn rollout the response holds tool and user turns (attention 1, response_mask 0) between
    the model's turns and always ends on a model token, so this length puts the score on the last model
    token and decodes the whole conversation."""
    responses = data.batch[keys.RESPONSES]
    if keys.ATTENTION_MASK in data.batch.keys():
        return data.batch[keys.ATTENTION_MASK][:, -responses.shape[-1] :].sum(-1).long()
    return data.batch[keys.RESPONSE_MASK].sum(-1).long()


def _extra_info(nt: dict, i: int) -> Any:
    """Row i's `extra_info`; for a multi-turn rollout a copy with verl's `num_turns` and
    `rollout_reward_scores` (the tools' `calc_reward`s) and the trajectory's `tool_calls`."""
    extra_info = nt[keys.EXTRA_INFO][i] if keys.EXTRA_INFO in nt else None
    if keys.NUM_TURNS not in nt:
        return extra_info
    stats = nt[keys.AGENT_METRICS][i] if keys.AGENT_METRICS in nt else {}
    return {**(extra_info or {}), "num_turns": int(nt[keys.NUM_TURNS][i]),
            "tool_calls": int(stats.get("tool_calls", 0)),
            "rollout_reward_scores": dict(nt[keys.TOOL_REWARDS][i] or {}) if keys.TOOL_REWARDS in nt else {}}


def decode_batch(data: Any, tokenizer: Any, reward_fn_key: str = keys.DATA_SOURCE) -> list[Sample]:
    """Decode the valid prompt and response tokens of every row of `data` (B rows).

    Reads `prompts` (B,P) left-padded, `responses` (B,R), `attention_mask` (B,P+R) (else `response_mask`);
    non-tensor `reward_fn_key` (default `data_source`), `reward_model`, `extra_info` (+ `__num_turns__`,
    `agent_metrics`, `tool_rewards` of multi-turn rollouts).
    """
    responses = data.batch[keys.RESPONSES]
    prompt_len = data.batch[keys.PROMPTS].shape[-1] if keys.PROMPTS in data.batch.keys() else None
    resp_lens = response_lengths(data).tolist()
    nt = data.non_tensor_batch
    samples = []
    for i in range(len(data)):
        prompt_str = ""
        if prompt_len is not None:
            prompt_mask = data.batch[keys.ATTENTION_MASK][i, :prompt_len].bool()
            prompt_str = tokenizer.decode(data.batch[keys.PROMPTS][i][prompt_mask], skip_special_tokens=True)
        valid = int(resp_lens[i])
        response_str = tokenizer.decode(responses[i, :valid], skip_special_tokens=True)
        reward_model = nt[keys.REWARD_MODEL][i] if keys.REWARD_MODEL in nt else {}
        samples.append(
            Sample(
                index=i,
                data_source=nt[reward_fn_key][i] if reward_fn_key in nt else None,
                prompt_str=prompt_str,
                response_str=response_str,
                ground_truth=(reward_model or {}).get("ground_truth"),
                extra_info=_extra_info(nt, i),
                valid_response_length=valid,
                row=nt[keys.INDEX][i] if keys.INDEX in nt else None,
            )
        )
    return samples


def call_reward_fn(fn: Any, sample: Sample) -> float | dict:
    """Call `fn` on one sample; any exception becomes a `RewardFunctionError` naming the sample."""
    try:
        return fn(
            data_source=sample.data_source,
            solution_str=sample.response_str,
            ground_truth=sample.ground_truth,
            extra_info=sample.extra_info,
        )
    except SystemExit as exc:  # exit() / sys.exit() would end the run with no word of why
        raise RewardFunctionError(sample.data_source, sample.index,
                                  f"called exit({exc.code!r}); a reward function must return a score",
                                  traceback.format_exc()) from None
    except Exception as exc:  # noqa: BLE001 - re-raised with the sample named
        raise RewardFunctionError(sample.data_source, sample.index, repr(exc), traceback.format_exc()) from exc


def split_result(result: Any, sample: Sample) -> tuple[float, dict[str, Any]]:
    """(score, extra) from a float or a dict with a `score` key; non-finite scores raise."""
    extra: dict[str, Any] = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise RewardFunctionError(
                sample.data_source, sample.index, f"returned a dict without a 'score' key: keys {sorted(result)}"
            )
        extra = {k: v for k, v in result.items() if k != "score"}
        result = result["score"]
    try:
        score = float(result)
    except (TypeError, ValueError) as exc:
        raise RewardFunctionError(sample.data_source, sample.index, f"score {result!r} is not a number") from exc
    if not math.isfinite(score):  # it would turn every advantage of its group into NaN
        where = "" if sample.row is None else f" for data row {sample.row}"
        raise RewardFunctionError(sample.data_source, sample.index, f"non-finite score {score}{where}; response: "
                                  f"{sample.response_str[:200]!r}; return a finite number (e.g. 0.0) for such a "
                                  "response")
    return score, extra


def place_scores(scores: list[float], lengths: list[int], shape: tuple[int, int]) -> torch.Tensor:
    """(B,R) float tensor, zero except `scores[i]` on the last valid response token of row i
    (token 0 for an empty response)."""
    out = torch.zeros(shape, dtype=torch.float32)
    for i, (score, length) in enumerate(zip(scores, lengths)):
        out[i, max(int(length) - 1, 0)] = score
    return out


def collect_extra(extras: list[dict[str, Any]]) -> dict[str, list]:
    """Per-sample extra dicts -> {name: list over samples} (missing entries are None)."""
    names = sorted({k for e in extras for k in e})
    return {name: [e.get(name) for e in extras] for name in names}


def print_examples(samples: list[Sample], scores: list[float], num_examine: int) -> None:
    """Print up to `num_examine` samples per data source, for eyeballing reward behaviour: one line each, the
    texts quoted (newlines and trailing spaces visible)."""
    printed: dict[Any, int] = {}
    for sample, score in zip(samples, scores):
        if printed.get(sample.data_source, 0) >= num_examine:
            continue
        printed[sample.data_source] = printed.get(sample.data_source, 0) + 1
        print(f"[prompt] {sample.prompt_str!r} [response] {sample.response_str!r} "
              f"[ground_truth] {sample.ground_truth} [score] {score}")


def finish(data: Any, samples: list[Sample], results: list[Any], num_examine: int, return_dict: bool):
    """Turn raw results (floats or dicts) into the manager's return value."""
    scores, extras = [], []
    for sample, result in zip(samples, results):
        score, extra = split_result(result, sample)
        scores.append(score)
        extras.append(extra)
    tensor = place_scores(scores, [s.valid_response_length for s in samples], tuple(data.batch[keys.RESPONSES].shape))
    print_examples(samples, scores, num_examine)
    if return_dict:
        return {"reward_tensor": tensor, "reward_extra_info": collect_extra(extras)}
    return tensor


def rm_scores_passthrough(data: Any, return_dict: bool):
    """When a reward model already scored the batch, its `rm_scores` are the reward (rules not run)."""
    scores = data.batch[keys.RM_SCORES]
    return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores

