"""Partial rollouts: one generation run as segments, paused at a token boundary and resumed, possibly with new
weights in between (`trainer.v1.separate_async.partial_rollout`, docs/async.md).

The state of a paused generation is the generation batch itself (prompt tensors, non-tensor fields, meta_info)
plus the tokens sampled so far, their log-probs and the policy version of each (keys `PARTIAL_*` and
`rollout_policy_versions`). A segment resubmits each unfinished row as prompt + its partial response with the
cap reduced by what it already holds, then splices the new tokens in; `finish` turns the state into an
ordinary rollout output (the fields of `assemble_output`, plus `rollout_policy_versions`). Engine-free: the
worker hands `request(...)` to its engine and the engine's output to `splice(...)`.
"""

from __future__ import annotations

import numpy as np
import torch

from rlpost import keys as K
from rlpost.protocol import DataProto
from rlpost.rollout.utils import assemble_output, eos_id_set, prompt_token_lists, row_caps

STATE_KEYS = (K.PARTIAL_TOKENS, K.PARTIAL_LOG_PROBS, K.PARTIAL_LENGTH, K.PARTIAL_CAP, K.PARTIAL_DONE,
              K.ROLLOUT_POLICY_VERSIONS)


def is_state(data: DataProto) -> bool:
    """Whether `data` is a paused generation (else a generation batch not started yet)."""
    return K.PARTIAL_DONE in data.batch


def start(prompts: DataProto, response_length: int) -> DataProto:
    """The empty state of a generation batch (B rows): nothing sampled, each row's cap its response cap."""
    rows = len(prompts)
    caps = row_caps(prompts, response_length) or [response_length] * rows
    pad_id = int(prompts.meta_info.get(K.META_PAD_TOKEN_ID) or 0)
    state = DataProto.from_dict(
        tensors={k: v for k, v in prompts.batch.items()},
        non_tensors=dict(prompts.non_tensor_batch or {}), meta_info=dict(prompts.meta_info))
    state.batch[K.PARTIAL_TOKENS] = torch.full((rows, response_length), pad_id, dtype=torch.int64)
    state.batch[K.PARTIAL_LOG_PROBS] = torch.zeros(rows, response_length)
    state.batch[K.ROLLOUT_POLICY_VERSIONS] = torch.full((rows, response_length), -1, dtype=torch.int64)
    state.batch[K.PARTIAL_LENGTH] = torch.zeros(rows, dtype=torch.int64)
    state.batch[K.PARTIAL_CAP] = torch.tensor(caps, dtype=torch.int64)
    state.batch[K.PARTIAL_DONE] = torch.tensor([c <= 0 for c in caps])
    return state


def request(state: DataProto, tokens: int | None) -> tuple[DataProto | None, list[int]]:
    """The engine request that continues `state`'s unfinished rows by at most `tokens` tokens each (None: to
    their caps): prompt + partial response as the prompt (left-padded `input_ids`, `attention_mask`,
    `position_ids` and `raw_prompt_ids`), `response_caps` the tokens left. Returns (request or None when every
    row is done, the state rows it holds)."""
    done, length, cap = (state.batch[k] for k in (K.PARTIAL_DONE, K.PARTIAL_LENGTH, K.PARTIAL_CAP))
    rows = [i for i in range(len(state)) if not bool(done[i])]
    if not rows:
        return None, []
    prompts = prompt_token_lists(state)
    partial = state.batch[K.PARTIAL_TOKENS]
    ids = [prompts[i] + partial[i, : int(length[i])].tolist() for i in rows]
    left = [int(cap[i] - length[i]) for i in rows]
    caps = [[n if tokens is None else min(n, tokens)] for n in left]
    width = max(len(r) for r in ids)
    pad_id = int(state.meta_info.get(K.META_PAD_TOKEN_ID) or 0)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for j, row in enumerate(ids):
        input_ids[j, width - len(row):] = torch.tensor(row, dtype=torch.int64)
        mask[j, width - len(row):] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    non_tensors = {K.RAW_PROMPT_IDS: _objects(ids), K.RESPONSE_CAPS: _objects(caps)}
    meta = {k: v for k, v in state.meta_info.items() if k != K.META_METRICS}
    return DataProto.from_dict(tensors={K.INPUT_IDS: input_ids, K.ATTENTION_MASK: mask, K.POSITION_IDS: position_ids},
                               non_tensors=non_tensors, meta_info=meta), rows


def _objects(rows: list[list[int]]) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out


def splice(state: DataProto, rows: list[int], out: DataProto, caps: list[int], version: int) -> None:
    """Append the engine's output for `rows` (its `responses`, `response_mask`, `rollout_log_probs`, one row each,
    asked for at most `caps[j]` tokens) to the state, sampled by policy `version`. A row is done when it stopped
    before its cap for this segment, ended on an EOS id, or reached its own response cap."""
    eos = eos_id_set(state.meta_info.get(K.META_EOS_TOKEN_ID))
    b = state.batch
    for j, i in enumerate(rows):
        n = int(out.batch[K.RESPONSE_MASK][j].sum())
        start = int(b[K.PARTIAL_LENGTH][i])
        new = out.batch[K.RESPONSES][j, :n]
        b[K.PARTIAL_TOKENS][i, start:start + n] = new
        b[K.PARTIAL_LOG_PROBS][i, start:start + n] = out.batch[K.ROLLOUT_LOG_PROBS][j, :n]
        b[K.ROLLOUT_POLICY_VERSIONS][i, start:start + n] = version
        b[K.PARTIAL_LENGTH][i] = start + n
        ended = n < caps[j] or (n > 0 and int(new[-1]) in eos) or start + n >= int(b[K.PARTIAL_CAP][i])
        b[K.PARTIAL_DONE][i] = ended


def finish(state: DataProto) -> DataProto:
    """The rollout output of a state whose rows are all done: `assemble_output`'s fields for the original
    prompts with the spliced tokens and log-probs, plus `rollout_policy_versions` (B, R)."""
    b = state.batch
    if not bool(b[K.PARTIAL_DONE].all()):
        raise ValueError("finish: the partial rollout still has unfinished rows")
    lengths = b[K.PARTIAL_LENGTH].tolist()
    tokens = [b[K.PARTIAL_TOKENS][i, :n].tolist() for i, n in enumerate(lengths)]
    log_probs = [b[K.PARTIAL_LOG_PROBS][i, :n].tolist() for i, n in enumerate(lengths)]
    prompts = DataProto.from_dict(
        tensors={k: b[k] for k in (K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS)},
        non_tensors=dict(state.non_tensor_batch or {}), meta_info=dict(state.meta_info))
    out = assemble_output(prompts, tokens, b[K.PARTIAL_TOKENS].shape[1], log_probs)
    out.batch[K.ROLLOUT_POLICY_VERSIONS] = torch.where(out.batch[K.RESPONSE_MASK].bool(),
                                                       b[K.ROLLOUT_POLICY_VERSIONS], torch.tensor(-1))
    return out
