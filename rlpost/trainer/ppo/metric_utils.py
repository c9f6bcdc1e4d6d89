"""Training/validation metrics under verl's names (critic/*, response_length/*, timing_s/*, perf/*).

`batch` arguments are DataProto-like: tensors in `batch.batch[key]`, meta data in `batch.meta_info`.
Shapes: B = rows, P = prompt length, R = response length.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np
import torch

from rlpost import keys
from rlpost.utils.metric import reduce_metrics  # noqa: F401  (verl's import path of it is this module)


_TOKEN_PHASES = ("ref", "values", "adv", "update_critic", "update_actor", "old_log_prob")


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    """{prefix/mean, prefix/max, prefix/min} of a 1-D tensor (0.0 each if empty)."""
    if x.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    x = x.float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def _lengths(batch: Any) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(prompt_length (B,), response_length (B,), max prompt length P, max response length R).

    Lengths count the real tokens (`attention_mask`): in a multi-turn rollout the response length includes
    the tool and user turns, which share the response budget."""
    max_response = batch.batch[keys.RESPONSES].shape[-1]
    attention = batch.batch[keys.ATTENTION_MASK]
    prompt_mask = attention[:, :-max_response]
    response_mask = attention[:, -max_response:]
    prompt_len = prompt_mask.sum(dim=-1).float()
    response_len = response_mask.sum(dim=-1).float()
    return prompt_len, response_len, prompt_mask.shape[-1], max_response


def compute_data_metrics(batch: Any, use_critic: bool = True) -> dict[str, float]:
    """Per-step data statistics.

    Reads `token_level_scores`, `token_level_rewards`, `advantages`, `returns`, `responses`,
    `attention_mask`, `response_mask` (falls back to the response part of `attention_mask`) and,
    with `use_critic`, `values`. Advantage/return/value stats are over valid response tokens.

    Returns:
        critic/score|rewards|advantages|returns/{mean,max,min}, with use_critic also
        critic/values/{mean,max,min} and critic/vf_explained_var = 1 - Var(G - V) / (Var(G) + 1e-5);
        response_length/{mean,max,min,clip_ratio} and prompt_length/{mean,max,min,clip_ratio}, where
        clip_ratio is the share of rows whose length equals the maximum (truncated); for multi-turn
        rollouts (per-row `agent_metrics` and `__num_turns__`) also the `multi_turn/*` metrics.
    """
    b = batch.batch
    prompt_len, response_len, max_prompt, max_response = _lengths(batch)
    valid = (b[keys.RESPONSE_MASK] if keys.RESPONSE_MASK in b else b[keys.ATTENTION_MASK][:, -max_response:]).bool()
    returns = torch.masked_select(b[keys.RETURNS], valid)
    metrics = {
        **_stats("critic/score", b[keys.TOKEN_LEVEL_SCORES].sum(dim=-1)),
        **_stats("critic/rewards", b[keys.TOKEN_LEVEL_REWARDS].sum(dim=-1)),
        **_stats("critic/advantages", torch.masked_select(b[keys.ADVANTAGES], valid)),
        **_stats("critic/returns", returns),
    }
    if use_critic:
        values = torch.masked_select(b[keys.VALUES], valid)
        metrics.update(_stats("critic/values", values))
        explained = 1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()
    metrics.update(_stats("response_length", response_len))
    metrics["response_length/clip_ratio"] = (response_len == max_response).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_len))
    metrics["prompt_length/clip_ratio"] = (prompt_len == max_prompt).float().mean().item()
    if keys.AGENT_METRICS in batch.non_tensor_batch:
        from rlpost.agent.metrics import summarize

        metrics.update(summarize(list(batch.non_tensor_batch[keys.NUM_TURNS]),
                                 list(batch.non_tensor_batch[keys.AGENT_METRICS])))
    return metrics


def compute_timing_metrics(batch: Any, timing_raw: dict[str, float]) -> dict[str, float]:
    """timing_s/<phase> for every timed phase, and timing_per_token_ms/<phase> where tokens apply.

    `gen` is divided by the response tokens; ref, values, adv, update_critic, update_actor and
    old_log_prob by all (prompt + response) tokens of the batch.
    """
    prompt_len, response_len, _, _ = _lengths(batch)
    n_response = response_len.sum().item()
    n_all = n_response + prompt_len.sum().item()
    tokens = {"gen": n_response, **{phase: n_all for phase in _TOKEN_PHASES}}
    metrics = {f"timing_s/{name}": float(sec) for name, sec in timing_raw.items()}
    for name, sec in timing_raw.items():
        if name in tokens and tokens[name] > 0:
            metrics[f"timing_per_token_ms/{name}"] = float(sec) * 1000.0 / tokens[name]
    return metrics


def compute_throughout_metrics(batch: Any, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """perf/total_num_tokens, perf/time_per_step (= timing_raw["step"]), perf/throughput.

    throughput = tokens / time_per_step / n_gpus (tokens per second per device). Tokens come from
    meta_info["global_token_num"] (per-row counts) when set, else from `attention_mask`.
    """
    meta = getattr(batch, "meta_info", None) or {}
    if keys.META_GLOBAL_TOKEN_NUM in meta:
        total = float(sum(meta[keys.META_GLOBAL_TOKEN_NUM]))
    else:
        total = float(batch.batch[keys.ATTENTION_MASK].sum().item())
    step = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total,
        "perf/time_per_step": step,
        "perf/throughput": total / (step * max(n_gpus, 1)),
    }


def _group_metrics(values_by_prompt: list[list[float]], n: int) -> dict[str, float]:
    """mean@n over all samples; with n > 1 also std@n, best@n/mean, worst@n/mean over prompts."""
    flat = [v for group in values_by_prompt for v in group]
    out = {f"mean@{n}": float(np.mean(flat))}
    if n > 1:
        out[f"std@{n}"] = float(np.mean([np.std(g) for g in values_by_prompt]))
        out[f"best@{n}/mean"] = float(np.mean([max(g) for g in values_by_prompt]))
        out[f"worst@{n}/mean"] = float(np.mean([min(g) for g in values_by_prompt]))
    return out


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_scores: Sequence[float],
    sample_uids: Sequence[Any] | None = None,
    infos_dict: dict[str, Sequence[float]] | None = None,
) -> dict[str, float]:
    """Validation metrics per data source.

    Samples are grouped into prompts by `sample_uids` (each sample its own prompt when None); n is
    the largest number of samples of one prompt in that data source.

    Args:
        data_sources: (N,) data source of each sample. sample_scores: (N,) score of each sample.
        sample_uids: (N,) prompt id of each sample. infos_dict: extra numeric per-sample values
            (e.g. "acc" from `reward_extra_info`), each (N,).

    Returns:
        val-core/<data_source>/reward/mean@<n> (+ std@n, best@n/mean, worst@n/mean when n > 1) and
        val-aux/<data_source>/<name>/<same metrics> for each entry of infos_dict.
    """
    if len(sample_scores) != len(data_sources):
        raise ValueError(f"{len(sample_scores)} scores for {len(data_sources)} data sources")
    uids = list(sample_uids) if sample_uids is not None else list(range(len(data_sources)))
    variables = {"reward": list(sample_scores), **{k: list(v) for k, v in (infos_dict or {}).items()}}
    metrics: dict[str, float] = {}
    for name, vals in variables.items():
        if len(vals) != len(data_sources):
            raise ValueError(f"validation variable {name!r} has {len(vals)} values for {len(data_sources)} samples")
        grouped: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
        for source, uid, v in zip(data_sources, uids, vals):
            grouped[source][uid].append(float(v))
        section = "val-core" if name == "reward" else "val-aux"
        for source, prompts in grouped.items():
            groups = list(prompts.values())
            n = max(len(g) for g in groups)
            for metric, value in _group_metrics(groups, n).items():
                metrics[f"{section}/{source}/{name}/{metric}"] = value
    return metrics


GEN_PARTS = ("gen_wake", "gen_engine", "gen_sleep")  # the rollout worker's own parts of `gen`


def add_gen_parts(timing: dict[str, float], worker_metrics: dict[str, Any]) -> None:
    """Add the wake / engine / sleep seconds of the rank whose generation took longest (summed over the
    generation batches of a step). With separate rollout devices they are the engine's own time, spent in
    the background, not inside the trainer's `gen` wait."""
    totals = worker_metrics.get("timing_s/generate_sequences")
    if not totals:
        return
    totals = totals if isinstance(totals, list) else [totals]
    slowest = max(range(len(totals)), key=totals.__getitem__)
    for part in GEN_PARTS:
        values = worker_metrics.get(f"timing_s/{part}")
        if values:
            values = values if isinstance(values, list) else [values]
            timing[part] = timing.get(part, 0.0) + values[slowest]
