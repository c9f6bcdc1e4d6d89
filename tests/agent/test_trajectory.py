"""Token-in/token-out trajectories with a real BPE tokenizer and a ChatML template with tools: masks, the
template delta, the sanity-check modes, the response budget across turns, tool-response truncation."""

import itertools

import pytest

from rlpost.agent.trajectory import (
    ModelTurn,
    TemplateDeltaError,
    TrajectoryBuilder,
    build_trajectory,
    encode,
    render,
    truncate_tool_text,
)

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "calc", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
PROMPT = [{"role": "user", "content": "What is 12 * 34?"}]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
TOOL_DELTA = "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def segments(tok, ids, mask):
    """[(mask value, decoded text)] of the runs of equal mask."""
    out, pos = [], 0
    for value, run in itertools.groupby(mask):
        n = len(list(run))
        out.append((value, tok.decode(ids[pos : pos + n], skip_special_tokens=False)))
        pos += n
    return out


def model(tok, text, eos=True):
    return encode(tok, text) + ([tok.eos_token_id] if eos else [])


def test_masks_and_tool_delta(chat_tokenizer):
    tok = chat_tokenizer
    turn1, turn2 = model(tok, CALL), model(tok, "#### 408")
    traj = build_trajectory(tok, PROMPT, [ModelTurn(turn1), [{"role": "tool", "content": "408"}], ModelTurn(turn2)],
                            max_response_length=200, tools=TOOLS, sanity_check_mode="strict")
    assert traj.prompt_ids == encode(tok, render(tok, PROMPT, TOOLS, True))
    assert segments(tok, traj.response_ids, traj.response_mask) == [
        (1, CALL + "<|im_end|>"), (0, TOOL_DELTA), (1, "#### 408<|im_end|>")]
    # the model's ids are in the response verbatim
    delta = encode(tok, TOOL_DELTA)
    assert traj.response_ids == turn1 + delta + turn2
    assert traj.response_mask == [1] * len(turn1) + [0] * len(delta) + [1] * len(turn2)
    assert traj.truncated is False and traj.sanity.ok
    assert traj.messages[1:] == [{"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"},
                                 {"role": "assistant", "content": "#### 408"}]
    assert traj.response_logprobs is None  # the turns came without log-probs


def test_parallel_tool_results_form_one_delta(chat_tokenizer):
    tok = chat_tokenizer
    traj = build_trajectory(tok, PROMPT, [ModelTurn(model(tok, CALL + CALL)),
                                          [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}],
                                          ModelTurn(model(tok, "ok"))],
                            max_response_length=1000, tools=TOOLS, sanity_check_mode="strict")
    assert segments(tok, traj.response_ids, traj.response_mask)[1] == (
        0, "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
           "<|im_end|>\n<|im_start|>assistant\n")
    assert traj.sanity.ok


def test_log_probs(chat_tokenizer):
    tok = chat_tokenizer
    t1, t2 = model(tok, CALL), model(tok, "#### 408")
    turns = [ModelTurn(t1, [-0.5] * len(t1)), [{"role": "tool", "content": "408"}], ModelTurn(t2, [-0.25] * len(t2))]
    traj = build_trajectory(tok, PROMPT, turns, max_response_length=200, tools=TOOLS)
    n_delta = len(encode(tok, TOOL_DELTA))
    assert traj.response_logprobs == [-0.5] * len(t1) + [0.0] * n_delta + [-0.25] * len(t2)
    without = build_trajectory(tok, PROMPT, [turns[0], turns[1], ModelTurn(t2)], max_response_length=200)
    assert without.response_logprobs is None
    with pytest.raises(ValueError, match="log_probs has 1 entries for 3 generated tokens"):
        TrajectoryBuilder(tok, PROMPT, 10).add_model_turn([5, 6, 7], [-1.0])


def test_model_tokens_are_never_retokenized(chat_tokenizer):
    """Ids the BPE would merge ("What is" is 2 tokens) stay as generated (7 one-char tokens); the strict
    check reports the difference, ignore_strippable too (it is not whitespace)."""
    tok = chat_tokenizer
    chars = [t for c in "What is" for t in encode(tok, c)] + [tok.eos_token_id]
    assert len(chars) == 8 and encode(tok, "What is") != chars[:-1]
    for mode, ok in [("strict", False), ("ignore_strippable", False), ("disable", True)]:
        traj = build_trajectory(tok, PROMPT, [ModelTurn(chars)], max_response_length=50, sanity_check_mode=mode)
        assert traj.response_ids == chars
        assert traj.sanity.ok is ok
    strict = build_trajectory(tok, PROMPT, [ModelTurn(chars)], max_response_length=50, sanity_check_mode="strict")
    assert strict.sanity.diffs == [("What is", "What is")]
    assert "1 difference(s)" in strict.sanity.describe()


def test_sanity_modes_on_whitespace_only_difference(trimming_tokenizer):
    """The template trims assistant content, so a turn that starts with a newline re-renders without it."""
    tok = trimming_tokenizer
    turns = [ModelTurn(model(tok, "\n42")), [{"role": "user", "content": "sure?"}], ModelTurn(model(tok, "#### 42"))]
    reports = {mode: build_trajectory(tok, PROMPT, turns, 100, sanity_check_mode=mode).sanity
               for mode in ("strict", "ignore_strippable", "disable")}
    assert not reports["strict"].ok and reports["strict"].diffs == [("", "\n")]
    assert reports["ignore_strippable"].ok and reports["disable"].ok
    with pytest.raises(ValueError, match="must be one of"):
        build_trajectory(tok, PROMPT, turns, 100, sanity_check_mode="lenient")


def test_budget_cuts_a_model_turn_and_stops(chat_tokenizer):
    tok = chat_tokenizer
    turn = model(tok, "#### 408")  # 7 ids
    traj = build_trajectory(tok, PROMPT, [ModelTurn(turn), [{"role": "tool", "content": "x"}], ModelTurn(turn)],
                            max_response_length=5)
    assert traj.response_ids == turn[:5] and traj.response_mask == [1] * 5 and traj.truncated


def test_budget_drops_a_delta_that_does_not_fit(chat_tokenizer):
    tok = chat_tokenizer
    turn1 = model(tok, CALL)
    n_delta = len(encode(tok, TOOL_DELTA))
    # room for the delta but not for one more model token: the delta is dropped, the last token is the model's
    builder = TrajectoryBuilder(tok, PROMPT, len(turn1) + n_delta, TOOLS)
    builder.add_model_turn(turn1)
    assert builder.add_messages([{"role": "tool", "content": "408"}]) is False
    result = builder.result("strict")
    assert result.response_ids == turn1 and result.response_mask[-1] == 1 and result.truncated
    assert result.sanity.ok  # the check compares the conversation the ids hold


def test_budget_across_turns(chat_tokenizer):
    tok = chat_tokenizer
    turn1, turn2 = model(tok, CALL), model(tok, "#### 408")
    n_delta = len(encode(tok, TOOL_DELTA))
    budget = len(turn1) + n_delta + 3
    traj = build_trajectory(tok, PROMPT, [ModelTurn(turn1), [{"role": "tool", "content": "408"}], ModelTurn(turn2)],
                            max_response_length=budget, tools=TOOLS)
    assert len(traj.response_ids) == budget
    assert traj.response_ids[-3:] == turn2[:3] and traj.response_mask[-3:] == [1, 1, 1]
    assert traj.truncated


def test_filling_the_budget_without_eos_is_truncation(chat_tokenizer):
    tok = chat_tokenizer
    exact = model(tok, "#### 4")
    assert not build_trajectory(tok, PROMPT, [ModelTurn(exact)], len(exact)).truncated
    assert build_trajectory(tok, PROMPT, [ModelTurn(exact[:-1])], len(exact) - 1).truncated


def test_turns_must_alternate(chat_tokenizer):
    builder = TrajectoryBuilder(chat_tokenizer, PROMPT, 50)
    with pytest.raises(ValueError, match="a model turn is expected next"):
        builder.add_messages([{"role": "user", "content": "hi"}])
    builder.add_model_turn([5])
    with pytest.raises(ValueError, match="the previous turn was also the model's"):
        builder.add_model_turn([5])


def test_template_that_is_not_prefix_stable(chat_tokenizer):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=chat_tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    tok.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    builder = TrajectoryBuilder(tok, PROMPT, 50)
    builder.add_model_turn(encode(tok, "a"))
    with pytest.raises(TemplateDeltaError, match="cannot be tokenized as a delta"):
        builder.add_messages([{"role": "user", "content": "b"}])


@pytest.mark.parametrize(
    "side, expected",
    [("left", "0123...(truncated)"), ("right", "(truncated)...6789"), ("middle", "01...(truncated)...89")],
)
def test_truncate_tool_text(chat_tokenizer, side, expected):
    # digits are single tokens in this tokenizer: 10 tokens, 4 kept
    assert truncate_tool_text(chat_tokenizer, "0123456789", 4, side) == expected
    assert truncate_tool_text(chat_tokenizer, "0123", 4, side) == "0123"


def test_truncate_tool_text_bad_side(chat_tokenizer):
    with pytest.raises(ValueError, match="tool_response_truncate_side must be one of"):
        truncate_tool_text(chat_tokenizer, "x", 4, "top")
