"""Training/validation metrics under verl's names (critic/*, response_length/*, timing_s/*, perf/*).

`batch` arguments are DataProto-like: tensors in `batch.batch[key]`, meta data in `batch.meta_info`.
Shapes: B = rows, P = prompt length, R = response length.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Sequence

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


def reward_component_metrics(fields: dict[str, Any], keys: Sequence[str]) -> dict[str, float]:
    """`gdpo/<key>/{mean,std,max,min}` of each reward component's per-row values (verl's names)."""
    out = {}
    for key in keys:
        values = np.asarray(fields[key], dtype=np.float64)
        out.update({f"gdpo/{key}/mean": float(values.mean()), f"gdpo/{key}/std": float(values.std()),
                    f"gdpo/{key}/max": float(values.max()), f"gdpo/{key}/min": float(values.min())})
    return out


def bootstrap_metric(data: Sequence[Any], subset_size: int, reduce_fns: Sequence[Callable[[list], float]],
                     n_bootstrap: int = 1000, seed: int = 42) -> list[tuple[float, float]]:
    """(mean, std) of each `reduce_fn` over `n_bootstrap` subsets of `subset_size` items of `data` drawn with
    replacement (verl's estimate of best@n / worst@n / maj@n from N >= n samples)."""
    rng = np.random.RandomState(seed)
    values: list[list[float]] = [[] for _ in reduce_fns]
    for _ in range(n_bootstrap):
        subset = [data[i] for i in rng.choice(len(data), size=subset_size, replace=True)]
        for out, fn in zip(values, reduce_fns):
            out.append(fn(subset))
    return [(float(np.mean(v)), float(np.std(v))) for v in values]


def calc_maj_val(data: Sequence[dict[str, Any]], vote_key: str, val_key: str) -> Any:
    """`val_key` of the first item whose `vote_key` is the most common one (majority voting)."""
    by_vote: dict[Any, list[Any]] = defaultdict(list)
    for item in data:
        by_vote[item[vote_key]].append(item[val_key])
    return max(by_vote.values(), key=len)[0]


def _prompt_metrics(values: list[float], preds: list[Any] | None, seed: int) -> dict[str, float]:
    """mean@N (+ std@N, and best@n / worst@n (/ maj@n with `preds`) as bootstrap mean and std for n = 2, 4,
    ..., N) of one prompt's N samples."""
    n_all = len(values)
    out = {f"mean@{n_all}": float(np.mean(values))}
    if n_all == 1:
        return out
    out[f"std@{n_all}"] = float(np.std(values))
    sizes = [2 ** i for i in range(1, n_all.bit_length()) if 2 ** i < n_all] + [n_all]
    for n in sizes:
        (best, best_std), (worst, worst_std) = bootstrap_metric(values, n, [np.max, np.min], seed=seed)
        out.update({f"best@{n}/mean": best, f"best@{n}/std": best_std,
                    f"worst@{n}/mean": worst, f"worst@{n}/std": worst_std})
        if preds is not None:
            votes = [{"val": v, "pred": p} for v, p in zip(values, preds)]
            [(maj, maj_std)] = bootstrap_metric(votes, n, [lambda d: calc_maj_val(d, "pred", "val")], seed=seed)
            out.update({f"maj@{n}/mean": maj, f"maj@{n}/std": maj_std})
    return out


def process_validation_metrics(data_sources: Sequence[str], sample_uids: Sequence[Any],
                               infos_dict: dict[str, Sequence[Any]], seed: int = 42,
                               ) -> dict[str, dict[str, dict[str, float]]]:
    """Validation statistics per data source, variable and metric (verl's function and result shape).

    Samples are grouped into prompts by `sample_uids`; each numeric variable of `infos_dict` (e.g. "reward",
    "acc"; a "pred" entry is the answer majority voting counts) gets `_prompt_metrics` per prompt, averaged over
    the prompts of the data source.

    Args:
        data_sources: (N,) data source of each sample. sample_uids: (N,) prompt id of each sample.
        infos_dict: name -> (N,) values; variables of strings are skipped.

    Returns:
        {data_source: {variable: {metric: value}}}, metrics as in `_prompt_metrics` (`validation_metric_dict`
        turns it into the logged `val-core/` and `val-aux/` keys).
    """
    for name, vals in infos_dict.items():
        if len(vals) != len(data_sources):
            raise ValueError(f"validation variable {name!r} has {len(vals)} values for {len(data_sources)} samples")
    grouped: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        grouped[source][uid].append(i)
    preds = infos_dict.get("pred")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for source, prompts in grouped.items():
        per_var: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for rows in prompts.values():
            for name, vals in infos_dict.items():
                values = [vals[i] for i in rows]
                if any(isinstance(v, str) for v in values):
                    continue
                prompt_preds = None if preds is None else [preds[i] for i in rows]
                for metric, value in _prompt_metrics([float(v) for v in values], prompt_preds, seed).items():
                    per_var[name][metric].append(value)
        out[source] = {name: {m: float(np.mean(v)) for m, v in metrics.items()} for name, metrics in per_var.items()}
    return out


def validation_metric_dict(nested: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """The logged keys of `process_validation_metrics`' result, as verl names them: `val-core/<source>/<var>/
    <metric>` for the core variable ("acc" when given, else "reward") at the largest n, its mean / maj / best;
    `val-aux/...` for the rest."""
    metrics = {}
    for source, by_var in nested.items():
        core = "acc" if "acc" in by_var else "reward"
        for name, by_metric in by_var.items():
            n_max = max(int(m.split("@")[-1].split("/")[0]) for m in by_metric)
            for metric, value in by_metric.items():
                is_core = (name == core and metric.startswith(("mean", "maj", "best")) and f"@{n_max}" in metric)
                metrics[f"{'val-core' if is_core else 'val-aux'}/{source}/{name}/{metric}"] = value
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
