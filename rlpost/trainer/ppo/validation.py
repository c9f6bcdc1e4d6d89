"""Validation during training, and JSONL dumps of generations.

Validation generates `rollout.val_kwargs.n` responses per held-out prompt with the validation sampling
settings, scores them with the validation reward function and reports verl's statistics
(`metric_utils.process_validation_metrics`): `val-core/<data_source>/<acc or reward>/mean@<n>` (+ best@n, maj@n by
bootstrap when n > 1), the other variables and sizes under `val-aux/`; multi-turn rollouts add the `multi_turn/*`
metrics of the validation trajectories as `val-aux/multi_turn/*`.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import numpy as np
from rlpost.config.schema import PPOTrainerConfig

from rlpost import keys as K
from rlpost.agent.metrics import summarize
from rlpost.protocol import DataProto
from rlpost.trainer.ppo.metric_utils import process_validation_metrics, validation_metric_dict


# Row fields the rollout reads: prompt ids for single-turn engines, the chat and the agent-loop inputs for
# multi-turn rollouts.
GENERATION_FIELDS = (K.RAW_PROMPT_IDS, K.UID, K.RAW_PROMPT, K.AGENT_NAME, K.TOOLS_KWARGS, K.INTERACTION_KWARGS,
                     K.RESPONSE_CAPS, K.MULTI_MODAL_DATA)


def generation_inputs(batch: DataProto, tokenizer, *, validate: bool, step: int, do_sample: bool,
                      chat_template_kwargs: dict[str, Any] | None = None) -> DataProto:
    """The rollout's input: prompt tensors and the row fields of `GENERATION_FIELDS` that `batch` has, with
    the sampling meta_info (and `data.apply_chat_template_kwargs`, which agent loops render with)."""
    gen = batch.select(
        batch_keys=[K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS],
        non_tensor_batch_keys=[k for k in GENERATION_FIELDS if k in batch.non_tensor_batch],
    )
    gen.meta_info.update({
        K.META_EOS_TOKEN_ID: tokenizer.eos_token_id,
        K.META_PAD_TOKEN_ID: tokenizer.pad_token_id,
        K.META_DO_SAMPLE: do_sample,
        K.META_VALIDATE: validate,
        K.META_GLOBAL_STEP: step,
        K.META_CHAT_TEMPLATE_KWARGS: dict(chat_template_kwargs or {}),
    })
    return gen


def chat_template_kwargs(config: PPOTrainerConfig) -> dict[str, Any]:
    """`data.apply_chat_template_kwargs` as a plain dict (a copy: the config's own is not handed out)."""
    return dict(config.data.apply_chat_template_kwargs or {})


class Validator:
    """Runs validation over the whole validation loader with the actor's rollout engine."""

    def __init__(self, config: PPOTrainerConfig, tokenizer, actor_rollout_wg, val_reward_fn, val_dataloader):
        self.config = config
        self.tokenizer = tokenizer
        self.actor_rollout_wg = actor_rollout_wg
        self.val_reward_fn = val_reward_fn
        self.val_dataloader = val_dataloader

    @property
    def enabled(self) -> bool:
        return self.val_dataloader is not None and self.val_reward_fn is not None

    def validate(self, step: int, tracker=None) -> dict[str, float]:
        """Generate, score and aggregate; logs sample tables and dumps when configured."""
        val_n = self.config.actor_rollout_ref.rollout.val_kwargs.n
        sources, scores, uids, prompts, responses = [], [], [], [], []
        extra_all: dict[str, list] = defaultdict(list)
        turns, agent_metrics = [], []  # per trajectory, from multi-turn rollouts
        for batch_dict in self.val_dataloader:
            batch = DataProto.from_single_dict(batch_dict)
            uids.extend(np.repeat(np.arange(len(uids), len(uids) + len(batch)), val_n).tolist())
            batch = batch.repeat(val_n, interleave=True)
            gen = generation_inputs(batch, self.tokenizer, validate=True, step=step,
                                    do_sample=self.config.actor_rollout_ref.rollout.val_kwargs.do_sample,
                                    chat_template_kwargs=chat_template_kwargs(self.config))
            out = self.actor_rollout_wg.generate_sequences(gen)
            out.meta_info.pop(K.META_METRICS, None)
            for k in (K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS):
                batch.batch.pop(k)
            batch = batch.union(out)
            result = self.val_reward_fn(batch, return_dict=True)
            if K.AGENT_METRICS in batch.non_tensor_batch:
                turns.extend(batch.non_tensor_batch[K.NUM_TURNS])
                agent_metrics.extend(batch.non_tensor_batch[K.AGENT_METRICS])
            scores.extend(result["reward_tensor"].sum(-1).tolist())
            for name, values in (result.get("reward_extra_info") or {}).items():
                extra_all[name].extend(values)
            sources.extend(batch.non_tensor_batch.get(K.DATA_SOURCE, np.array(["unknown"] * len(batch))))
            prompts.extend(_decode(self.tokenizer, batch.batch[K.PROMPTS]))
            responses.extend(_decode_responses(self.tokenizer, batch))
        numeric = {k: v for k, v in extra_all.items() if all(isinstance(x, (int, float, bool)) for x in v)}
        # "pred" (the answer, often text) is what majority voting counts: passed on even when not numeric
        infos = {"reward": scores, **{k: v for k, v in numeric.items() if k != "reward"},
                 **({"pred": extra_all["pred"]} if "pred" in extra_all else {})}
        metrics = validation_metric_dict(process_validation_metrics([str(s) for s in sources], uids, infos))
        metrics.update({f"val-aux/{k}": v for k, v in summarize(turns, agent_metrics).items()})
        self._log_samples(tracker, prompts, responses, scores, step)
        out_dir = self.config.trainer.validation_data_dir
        if out_dir:
            write_jsonl(out_dir, step, prompts, responses, scores, dict(extra_all))
        return metrics

    def _log_samples(self, tracker, prompts, responses, scores, step) -> None:
        n = self.config.trainer.log_val_generations
        if not n:
            return
        rng = np.random.RandomState(42)  # the same samples every validation, so they can be compared
        idx = rng.permutation(len(prompts))[:n]
        rows = [(prompts[i], responses[i], float(scores[i])) for i in sorted(idx)]
        from rlpost.utils.tracking import ValidationGenerationsLogger

        ValidationGenerationsLogger(self.config.trainer.default_local_dir).log(self.config.trainer.logger, rows, step)


def _decode(tokenizer, ids) -> list[str]:
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def _decode_responses(tokenizer, batch: DataProto) -> list[str]:
    """Every real response token: in a multi-turn rollout the whole conversation after the prompt, tool and
    user turns included (their `response_mask` is 0 but `attention_mask` is 1)."""
    responses = batch.batch[K.RESPONSES]
    mask = batch.batch[K.ATTENTION_MASK][:, -responses.shape[1]:].bool()
    return [tokenizer.decode(r[m], skip_special_tokens=True) for r, m in zip(responses, mask)]


def write_jsonl(out_dir: str, step: int, prompts, responses, scores, extra: dict[str, list[Any]]) -> str:
    """Write one JSON object per sample to `<out_dir>/<step>.jsonl`; returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{step}.jsonl")
    with open(path, "w") as f:
        for i, (p, r, s) in enumerate(zip(prompts, responses, scores)):
            row = {"step": step, "prompt": p, "response": r, "score": float(s)}
            row.update({k: _jsonable(v[i]) for k, v in extra.items() if i < len(v)})
            f.write(json.dumps(row) + "\n")
    return path


def _jsonable(v):
    if isinstance(v, (np.generic,)):
        return v.item()
    return v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else str(v)


def dump_generations(tokenizer, batch: DataProto, out_dir: str, step: int, extra: dict[str, list]) -> str:
    """Dump the training rollouts of one step (trainer.rollout_data_dir). Multi-turn rows also get
    `model_text` (only the tokens the loss trains on: `response_mask` 1, the model's turns), `num_turns` and
    the trajectory's counters (`tool_calls`, `truncated`, ...)."""
    prompts = _decode(tokenizer, batch.batch[K.PROMPTS])
    responses = _decode_responses(tokenizer, batch)
    scores = batch.batch[K.TOKEN_LEVEL_SCORES].sum(-1).tolist()
    if K.AGENT_METRICS in batch.non_tensor_batch:
        mask = batch.batch[K.RESPONSE_MASK].bool()
        counters = list(batch.non_tensor_batch[K.AGENT_METRICS])
        extra = {**extra, "model_text": [tokenizer.decode(r[m], skip_special_tokens=True)
                                         for r, m in zip(batch.batch[K.RESPONSES], mask)],
                 "num_turns": [int(n) for n in batch.non_tensor_batch[K.NUM_TURNS]],
                 **{name: [c.get(name) for c in counters] for name in sorted(counters[0])}}
    return write_jsonl(out_dir, step, prompts, responses, scores, extra)
