"""Token-in / token-out trajectories: the model's tokens exactly as generated, everything else as the
chat template's delta.

    prompt_ids   = tokens of render(prompt messages, tools, add_generation_prompt=True)
    response_ids = model turn | tool/user delta | model turn | ...
    response_mask  1 1 ... 1  |   0 0 ... 0      |  1 1 ... 1

A model turn's ids are appended verbatim (never decoded and re-encoded). Messages that answer it
(tool results, a user reply) are tokenized as the text the template adds for them:
render(conversation + new, add_generation_prompt=True) minus render(conversation), which includes the
next assistant header. The text the template puts after the model's EOS (ChatML's newline) is not in the
model's tokens; it is prepended to that delta. `max_response_length` bounds the whole response: a model
turn is cut to fit and a delta that does not fit is dropped; either marks the trajectory truncated and
ends it, so the last response token is always a model token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Union

from rlpost.agent.sanity import SanityReport, check_tokenization

TRUNCATE_SIDES = ("left", "middle", "right")


class TemplateDeltaError(ValueError):
    """The chat template renders the conversation differently once a message is added (its text is not a
    prefix), so the new message cannot be tokenized as a delta."""


def render(
    tokenizer: Any, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
    template_kwargs: dict | None = None,
) -> str:
    """The chat template's text for `messages` (tools passed as `tools=` when there are any)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False,
        **(template_kwargs or {}),
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of `text` without BOS/EOS added (the template wrote every special token it wants)."""
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def decode(tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def message_delta(before: str, after: str) -> str:
    """`after` minus its prefix `before`.

    Raises:
        TemplateDeltaError: `after` does not start with `before`.
    """
    if not after.startswith(before):
        raise TemplateDeltaError(
            "the chat template renders the conversation differently once a message is added, so the new "
            f"message cannot be tokenized as a delta; conversation ends with {before[-80:]!r}, with the new "
            f"message the text continues {after[max(0, len(before) - 80):len(before) + 80]!r}"
        )
    return after[len(before):]


def closing_text(turn_text: str | None, generated: str, eos_token: str | None) -> str:
    """What the template writes after the model's tokens for its turn (ChatML: "\\n" after <|im_end|>;
    "<|im_end|>\\n" when the model was cut before its EOS).

    Args:
        turn_text: the template's text for the assistant turn (after the generation prompt), or None.
        generated: the model's tokens decoded with special tokens kept.
        eos_token: text of the EOS token, used when the template reformatted the content before it.
    """
    if turn_text is None:
        return ""
    if turn_text.startswith(generated):
        return turn_text[len(generated):]
    if eos_token and generated.endswith(eos_token) and eos_token in turn_text:
        return turn_text[turn_text.rindex(eos_token) + len(eos_token):]
    return ""


def truncate_tool_text(tokenizer: Any, text: str, max_tokens: int, side: str) -> str:
    """Cut a tool response to `max_tokens` tokens, keeping the side verl keeps: `left` keeps the start,
    `right` the end, `middle` the start and the end; a marker shows where text was removed.

    Raises:
        ValueError: unknown side.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side must be one of {list(TRUNCATE_SIDES)}, got {side!r}")
    ids = encode(tokenizer, text)
    if len(ids) <= max_tokens:
        return text
    if side == "left":
        return decode(tokenizer, ids[:max_tokens], False) + "...(truncated)"
    if side == "right":
        return "(truncated)..." + decode(tokenizer, ids[len(ids) - max_tokens:], False)
    head = max_tokens // 2
    tail = max_tokens - head
    return decode(tokenizer, ids[:head], False) + "...(truncated)..." + decode(tokenizer, ids[len(ids) - tail:], False)


@dataclass
class TrajectoryTokens:
    """A finished trajectory.

    Attributes:
        prompt_ids: (P,) the templated prompt.
        response_ids: (R,) model turns and deltas, R <= max_response_length.
        response_mask: (R,) 1 on model tokens, 0 on tool/user tokens.
        response_logprobs: (R,) the engine's log-probs on model tokens, 0.0 elsewhere; None when a model
            turn came without them.
        truncated: the response budget cut a turn or stopped the conversation.
        messages: the conversation (model turns decoded) the ids correspond to.
        sanity: the tokenization check's report (mode `disable`: ok, nothing compared).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    truncated: bool
    messages: list[dict]
    sanity: SanityReport


class TrajectoryBuilder:
    """Builds one trajectory turn by turn: `add_model_turn` and `add_messages` alternate, starting with a
    model turn.

    Args:
        tokenizer: a HF tokenizer with a chat template.
        messages: the prompt messages.
        max_response_length: token budget of the whole response (all turns).
        tools: tool schemas for the template's `tools=` (None: no tools).
        template_kwargs: extra `apply_chat_template` arguments (data.apply_chat_template_kwargs).
    """

    def __init__(
        self, tokenizer: Any, messages: list[dict], max_response_length: int, tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> None:
        self.tokenizer, self.tools, self.template_kwargs = tokenizer, tools, template_kwargs
        self.max_response_length = max_response_length
        self.messages = [dict(m) for m in messages]
        self._open_text = self._render(self.messages, True)  # text up to the open assistant header
        self.prompt_ids = encode(tokenizer, self._open_text)
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self._logprobs: list[float] | None = []
        self._tail = ""  # template text closing the last model turn, not in the ids
        self._closed_text = ""  # the template's text of the conversation up to the last model turn
        self._expects_model = True
        self.truncated = False
        self.last_turn_raw = ""  # the last model turn decoded with special tokens kept (tool-call parsers read it)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return render(self.tokenizer, messages, self.tools, add_generation_prompt, self.template_kwargs)

    @property
    def remaining(self) -> int:
        """Response tokens left in the budget."""
        return self.max_response_length - len(self.response_ids)

    def add_model_turn(self, token_ids: Sequence[int], log_probs: Sequence[float] | None = None) -> str:
        """Append generated ids verbatim (mask 1), cut to the budget; return the turn's text (special tokens
        skipped), which is also appended to `messages` as the assistant message.

        Raises:
            ValueError: a model turn where a tool/user turn was expected, or log_probs of another length.
        """
        if not self._expects_model:
            raise ValueError("add_model_turn: the previous turn was also the model's; add the answering messages first")
        if log_probs is not None and len(log_probs) != len(token_ids):
            raise ValueError(f"log_probs has {len(log_probs)} entries for {len(token_ids)} generated tokens")
        ids = list(token_ids)
        eos_id = self.tokenizer.eos_token_id
        if len(ids) > self.remaining:
            ids, self.truncated = ids[: self.remaining], True
        elif len(ids) == self.remaining and (not ids or ids[-1] != eos_id):
            self.truncated = True  # filled the budget without finishing the turn
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        if self._logprobs is not None and log_probs is not None:
            self._logprobs += [float(x) for x in log_probs[: len(ids)]]
        else:
            self._logprobs = None
        content = decode(self.tokenizer, ids, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": content})
        closed = self._closed_text = self._render(self.messages, False)
        turn_text = closed[len(self._open_text):] if closed.startswith(self._open_text) else None
        self.last_turn_raw = decode(self.tokenizer, ids, False)
        self._tail = closing_text(turn_text, self.last_turn_raw, self.tokenizer.eos_token)
        self._expects_model = False
        return content

    def add_messages(self, new_messages: list[dict]) -> bool:
        """Append tool/user messages as the template's delta (mask 0), ending with the next assistant
        header. When the delta does not leave room for at least one model token, nothing is added, the
        trajectory is marked truncated and False is returned.

        Raises:
            ValueError: called twice without a model turn in between.
            TemplateDeltaError: the template is not prefix-stable for these messages.
        """
        if self._expects_model:
            raise ValueError("add_messages: a model turn is expected next")
        after = self._render(self.messages + list(new_messages), True)
        ids = encode(self.tokenizer, self._tail + message_delta(self._closed_text, after))
        if len(ids) >= self.remaining:
            self.truncated = True
            return False
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        if self._logprobs is not None:
            self._logprobs += [0.0] * len(ids)
        self.messages += [dict(m) for m in new_messages]
        self._open_text, self._tail, self._expects_model = after, "", True
        return True

    def sanity_check(self, mode: str) -> SanityReport:
        """Compare the ids with one tokenization of the whole conversation (see `sanity.py`)."""
        if mode == "disable":
            return check_tokenization(self.tokenizer, [], [], mode)
        reference = encode(self.tokenizer, self._render(self.messages, self._expects_model))
        actual = self.prompt_ids + self.response_ids + encode(self.tokenizer, self._tail)
        return check_tokenization(self.tokenizer, reference, actual, mode)

    def result(self, sanity_check_mode: str) -> TrajectoryTokens:
        """The trajectory so far, with the tokenization check run in `sanity_check_mode`."""
        return TrajectoryTokens(
            prompt_ids=list(self.prompt_ids), response_ids=list(self.response_ids),
            response_mask=list(self.response_mask),
            response_logprobs=None if self._logprobs is None else list(self._logprobs),
            truncated=self.truncated, messages=[dict(m) for m in self.messages],
            sanity=self.sanity_check(sanity_check_mode),
        )


@dataclass(frozen=True)
class ModelTurn:
    """Tokens the engine generated for one assistant turn, with their log-probs if it gave them."""

    token_ids: Sequence[int]
    log_probs: Sequence[float] | None = None


Turn = Union[ModelTurn, Sequence[dict]]


def build_trajectory(
    tokenizer: Any, prompt_messages: list[dict], turns: Sequence[Turn], max_response_length: int,
    tools: list[dict] | None = None, template_kwargs: dict | None = None, sanity_check_mode: str = "disable",
) -> TrajectoryTokens:
    """Fold alternating turns (ModelTurn, then a list of tool/user messages, ...) into ids and masks; stops
    at the first turn the budget truncates. Arguments as `TrajectoryBuilder`, plus the check's mode."""
    builder = TrajectoryBuilder(tokenizer, prompt_messages, max_response_length, tools, template_kwargs)
    for turn in turns:
        if builder.truncated:
            break
        if isinstance(turn, ModelTurn):
            builder.add_model_turn(turn.token_ids, turn.log_probs)
        else:
            builder.add_messages(list(turn))
    return builder.result(sanity_check_mode)
