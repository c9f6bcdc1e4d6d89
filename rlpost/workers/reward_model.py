"""Reward-model worker: a frozen, FSDP2-sharded `AutoModelForSequenceClassification` (one label) that scores
each (prompt, response) row; the score is placed on the last valid response token as `rm_scores` (B, R).

Config: the `reward_model` group (model.path, model.input_tokenizer, model.use_remove_padding, model.fsdp_config,
micro_batch_size_per_gpu, use_dynamic_bsz, forward_max_token_len_per_gpu, max_length,
ulysses_sequence_parallel_size). With remove-padding the rows of a micro-batch are packed into one row and each
row's score is read at its last token; with Ulysses sequence parallelism (which needs remove-padding) the ranks of
a group share the rows and each runs a slice of the packed row, through the critic's path
(`rlpost.workers.actor.sequence_parallel_forward`). When `model.input_tokenizer` (the policy's
tokenizer) differs from the RM's tokenizer, rows are decoded to text, wrapped in the RM's chat template and
re-tokenised; otherwise the policy's `input_ids` are scored as they are.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import torch

from rlpost import keys
from rlpost.config.convert import typed_group
from rlpost.config.schema import RewardModelConfig
from rlpost.protocol import DataProto
from rlpost.single_controller.base import Dispatch, register
from rlpost.utils.distributed import init_distributed
from rlpost.engine.fsdp import apply_fsdp2, compute_dtype, load_model_to, offload_model, reshard
from rlpost.utils.import_utils import import_external_libs
from rlpost.utils.model import load_hf_config
from rlpost.engine.packed_attention import PACKED_KWARG, packed_sequences, use_packed_attention
from rlpost.utils.padding import unpad_input
from rlpost.utils.profiler import phase
from rlpost.utils.shm import local_model_path
from rlpost.engine.ulysses import SequenceParallel, new_sequence_parallel, sp_size, use_ulysses_attention
from rlpost.workers.actor import sequence_parallel_forward
from rlpost.workers.batching import TensorDict, group_rows, micro_batches, own_rows, sp_parts
from rlpost.workers.profiling import ProfiledWorker

# Pooling id that never occurs in input_ids, so HF's "rightmost non-pad token" pooling takes the last column.
_NO_PAD_ID = -1


def load_reward_model(model_cfg: Any, dtype: torch.dtype) -> torch.nn.Module:
    """`AutoModelForSequenceClassification` (num_labels=1) of `model_cfg.path` (read from its /dev/shm copy with
    `use_shm`), eval mode, on CPU.

    Raises:
        ValueError: the checkpoint has no trained classification head (e.g. a plain causal LM), which would
            otherwise be initialised at random without notice.
    """
    from transformers import AutoModelForSequenceClassification

    import_external_libs(model_cfg.external_lib)
    trust = model_cfg.trust_remote_code
    path = local_model_path(model_cfg)
    hf_config = load_hf_config(path, trust, model_cfg.override_config)
    hf_config.num_labels = 1
    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, config=hf_config, dtype=dtype, attn_implementation="sdpa", output_loading_info=True,
        trust_remote_code=trust)
    if info.get("missing_keys"):
        raise ValueError(f"reward_model.model.path={model_cfg.path} is not a sequence-classification checkpoint: "
                         f"missing {sorted(info['missing_keys'])[:4]}")
    # Rows are right-aligned before the forward (see `right_align`): the last column is the last real token.
    model.config.get_text_config().pad_token_id = _NO_PAD_ID
    return model.eval()


class TokenScores:
    """A sequence-classification model seen as a per-token scorer: its forward returns (as `.logits`) what the
    classification head computes at every token, caught by a forward hook on the head (the model itself pools
    one position per row, which on a packed row or a slice of one is not a row's last token).

    Raises:
        ValueError: the model has no `score` linear head (the transformers convention for decoder models).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        head = getattr(model, "score", None)
        if not isinstance(head, torch.nn.Linear):
            raise ValueError(f"{type(model).__name__} has no `score` linear head, which packed rows "
                             "(reward_model.model.use_remove_padding=true, needed by Ulysses) read per token; set "
                             "reward_model.model.use_remove_padding=false "
                             "reward_model.ulysses_sequence_parallel_size=1")
        self.model, self.head = model, head

    def forward(self, **inputs: Any) -> SimpleNamespace:
        """(1, N, 1) head output of a packed row (or of this rank's slice of one) as `.logits`."""
        caught: list[torch.Tensor] = []
        handle = self.head.register_forward_hook(lambda _m, _args, out: caught.append(out))
        try:
            self.model(**inputs)
        finally:
            handle.remove()
        return SimpleNamespace(logits=caught[0])

    __call__ = forward


def _first_label(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(n, 1) head output -> (n,) float32 scores (labels unused)."""
    return logits[:, 0].float()


def packed_last_token_scores(scorer: TokenScores, mb: TensorDict, sp: SequenceParallel | None) -> torch.Tensor:
    """Score each row at its last real token, the rows packed into one (remove-padding).

    Args:
        mb: `input_ids`, `attention_mask`, `position_ids` (b, T), any padding.
        sp: Ulysses group (its ranks hold the same rows and each runs a slice); None: one rank runs the row.

    Returns:
        (b,) float32 scores, the same on every rank of the group; 0 for a row without tokens.
    """
    mask = mb[keys.ATTENTION_MASK]
    packed_ids, packed_pos, _ = unpad_input(mb[keys.INPUT_IDS], mask, mb[keys.POSITION_IDS])
    lens = mask.sum(-1)
    last = (torch.cumsum(lens, 0) - 1).clamp(min=0)  # packed index of each row's last token
    if sp is not None:
        scores = sequence_parallel_forward(scorer, packed_ids, packed_pos, mask, last, _first_label, sp, None)
    else:
        logits = scorer(input_ids=packed_ids, position_ids=packed_pos, attention_mask=None, use_cache=False,
                        **{PACKED_KWARG: packed_sequences(lens, packed_ids.device)}).logits
        scores = _first_label(logits[0, last], None)
    return torch.where(lens > 0, scores, torch.zeros_like(scores))


def right_align(tensors: TensorDict) -> TensorDict:
    """Move each row's real tokens (attention_mask == 1) to the right end, keeping their order.

    Args:
        tensors: `input_ids`, `attention_mask`, `position_ids` (b, T) with any mix of left/right padding.

    Returns:
        the same keys (b, T), padding on the left only, so column T-1 is every row's last real token.
    """
    order = torch.argsort(tensors[keys.ATTENTION_MASK], dim=1, stable=True)
    return {k: torch.gather(v, 1, order) for k, v in tensors.items()}


def keep_last(tensors: TensorDict, max_length: int | None) -> TensorDict:
    """Truncate right-aligned rows to their last `max_length` tokens (the score is read at the end)."""
    if max_length is None or tensors[keys.INPUT_IDS].shape[1] <= max_length:
        return tensors
    return {k: v[:, -max_length:] for k, v in tensors.items()}


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Scatter per-row scores onto the last valid response token.

    Args:
        scores: (B,) sequence scores. response_mask: (B, R) 1 on valid response tokens.

    Returns:
        (B, R) float32, `scores[i]` at the last valid position of row i, zero elsewhere (all zero for an
        empty response).
    """
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    lengths = response_mask.sum(dim=-1).long()
    rows = torch.nonzero(lengths > 0).squeeze(-1)
    out[rows, lengths[rows] - 1] = scores[rows].float().cpu()
    return out


def same_tokenizer(a: Any, b: Any) -> bool:
    """True when both tokenizers map text to the same ids and wrap chats the same way."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


def rm_chat_texts(data: DataProto, src_tokenizer: Any, rm_tokenizer: Any) -> list[str]:
    """Each row as the RM's chat-template text: [prompt messages..., assistant response].

    The prompt messages are `raw_prompt` (data.return_raw_chat=True) when present; otherwise the prompt
    tokens decoded with the policy tokenizer (special tokens dropped) form one user message.
    Reads `input_ids`, `attention_mask` (B, T), `responses` (B, R), non-tensor `raw_prompt` (optional).
    """
    ids, mask = data.batch[keys.INPUT_IDS], data.batch[keys.ATTENTION_MASK].bool()
    r = data.batch[keys.RESPONSES].shape[1]
    raw = data.non_tensor_batch.get(keys.RAW_PROMPT)
    texts = []
    for i in range(ids.shape[0]):
        response = src_tokenizer.decode(ids[i, -r:][mask[i, -r:]].tolist(), skip_special_tokens=True)
        if raw is not None:
            chat = [dict(m) for m in raw[i]]
        else:
            prompt = src_tokenizer.decode(ids[i, :-r][mask[i, :-r]].tolist(), skip_special_tokens=True)
            chat = [{"role": "user", "content": prompt}]
        chat.append({"role": "assistant", "content": response})
        texts.append(rm_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False))
    return texts


def tokenize_left_padded(texts: list[str], tokenizer: Any, max_length: int | None) -> TensorDict:
    """Tokenise (the template already holds any BOS), keep the last `max_length` tokens, pad on the left.

    Returns:
        `input_ids`, `attention_mask`, `position_ids` (B, L), L = longest kept row.
    """
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    rows = [row[-max_length:] if max_length else row for row in rows]
    width = max(1, max(len(row) for row in rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask, keys.POSITION_IDS: pos}


class RewardModelWorker(ProfiledWorker):
    """Scores responses with a learned reward model, colocated with the actor (same process and group).

    Args:
        config: the typed `reward_model` group, or its DictConfig (converted and checked here, once).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        config = typed_group(config, RewardModelConfig, "reward_model.")
        self.config = config
        init_distributed(self.device)
        self.module: torch.nn.Module | None = None
        self.tokenizer = self.input_tokenizer = None
        self.retemplate = False
        self.sp = new_sequence_parallel(config.ulysses_sequence_parallel_size)  # None without Ulysses
        self.scorer: TokenScores | None = None  # remove-padding: the per-token view of `module`

    def _load_tokenizers(self) -> None:
        """RM and policy tokenizers, only when `input_tokenizer` is set; decides whether to re-template."""
        from transformers import AutoTokenizer

        model_cfg = self.config.model
        src = model_cfg.input_tokenizer
        if src is None:
            return
        trust = model_cfg.trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(local_model_path(model_cfg), trust_remote_code=trust)
        if os.path.realpath(os.path.expanduser(str(src))) == os.path.realpath(os.path.expanduser(model_cfg.path)):
            return
        self.input_tokenizer = AutoTokenizer.from_pretrained(src, trust_remote_code=trust)
        self.retemplate = not same_tokenizer(self.input_tokenizer, self.tokenizer)
        if self.retemplate and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"reward_model.model.path={model_cfg.path}: its tokenizer has no chat template, needed "
                             f"to re-wrap rows of input_tokenizer={src}; set input_tokenizer=null to score as is")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the RM in the compute dtype (fp32 on CPU, bf16 on CUDA), shard it, offload if asked; with
        remove-padding its attention runs on packed rows, with a Ulysses group on slices of them."""
        if self.sp is not None and not self.config.model.use_remove_padding:
            raise ValueError("Ulysses sequence parallelism runs on packed rows: reward_model."
                             f"ulysses_sequence_parallel_size={self.sp.size} needs reward_model.model."
                             "use_remove_padding=true")
        self._load_tokenizers()
        fsdp_cfg = self.config.model.fsdp_config
        self.module = load_reward_model(self.config.model, compute_dtype(self.device))
        # The group has no offload_policy (as in verl): param_offload moves the frozen shards instead.
        apply_fsdp2(self.module, self.device, fsdp_size=fsdp_cfg.fsdp_size,
                    reshard_after_forward=fsdp_cfg.reshard_after_forward, offload_policy=False,
                    min_num_params=fsdp_cfg.wrap_policy.min_num_params, trainable=False,
                    forward_prefetch=fsdp_cfg.forward_prefetch)
        if self.config.model.use_remove_padding:
            self.scorer = TokenScores(self.module)
            use_packed_attention(self.module)
        if self.sp is not None:
            use_ulysses_attention(self.module, self.sp.size)
        if fsdp_cfg.param_offload:
            offload_model(self.module)

    def _rm_inputs(self, data: DataProto) -> TensorDict:
        """The rows as RM input (B, L), padding on the left, at most `max_length` tokens each."""
        max_length = self.config.max_length  # null: the whole row
        if self.retemplate:
            texts = rm_chat_texts(data, self.input_tokenizer, self.tokenizer)
            return tokenize_left_padded(texts, self.tokenizer, max_length)
        tensors = {k: data.batch[k] for k in (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS)}
        return keep_last(right_align(tensors), max_length)

    @torch.no_grad()
    def _scores(self, inputs: TensorDict) -> torch.Tensor:
        """(B,) float32 logits at each row's last real token, micro-batched like the critic's forward (the token
        budget is per device: the devices of a Ulysses group share each micro-batch)."""
        cfg = self.config
        micros, rev = micro_batches(inputs, cfg.micro_batch_size_per_gpu, cfg.use_dynamic_bsz,
                                    cfg.forward_max_token_len_per_gpu * sp_size(self.sp))
        out = []
        for mb in micros:
            mb = {k: v.to(self.device) for k, v in mb.items()}
            if self.scorer is not None:
                out.append(packed_last_token_scores(self.scorer, mb, self.sp).cpu())
                continue
            logits = self.module(input_ids=mb[keys.INPUT_IDS], attention_mask=mb[keys.ATTENTION_MASK],
                                 position_ids=mb[keys.POSITION_IDS], use_cache=False).logits
            out.append(logits[:, 0].float().cpu())
        scores = torch.cat(out)
        return scores[rev] if rev is not None else scores

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("rm")
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """Reads `input_ids`, `attention_mask`, `position_ids` (B, T), `responses` (B, R), non-tensor
        `raw_prompt` (re-templating only); writes `rm_scores` (B, R): the score on the last response token.
        The ranks of a Ulysses group score their rows together and each returns its own."""
        fsdp_cfg = self.config.model.fsdp_config
        rows = len(data)
        data, start = group_rows(data, *sp_parts(self.sp))
        inputs = self._rm_inputs(data)
        if fsdp_cfg.param_offload:
            load_model_to(self.module, self.device)
        scores = self._scores(inputs)
        reshard(self.module)  # no gathered units past the phase (reshard_after_forward=false)
        if fsdp_cfg.param_offload:
            offload_model(self.module)
        r = data.batch[keys.RESPONSES].shape[1]
        rm = place_on_last_token(scores, data.batch[keys.ATTENTION_MASK][:, -r:])
        return own_rows(DataProto.from_dict(tensors={keys.RM_SCORES: rm}), start, rows)
