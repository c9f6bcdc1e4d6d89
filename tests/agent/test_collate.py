"""Collating agent-loop outputs into the single-turn rollout's batch fields, and the step metrics."""

import pytest
import torch

from rlpost import keys
from rlpost.agent import AgentLoopOutput, aggregate_metrics, collate_agent_outputs

PAD = 0


def outputs():
    # row 0: prompt [5, 6], response model [7, 8] | tool [9] | model [10]
    # row 1: prompt [4, 5, 6], response model [11]
    return [
        AgentLoopOutput([5, 6], [7, 8, 9, 10], [1, 1, 0, 1], [-1.0, -2.0, 0.0, -3.0], num_turns=4,
                        metrics={"tool_calls": 1.0, "tool_errors": 1.0, "bad_tool_calls": 0.0, "truncated": 0.0,
                                 "interaction_turns": 0.0, "tokenization_mismatch": 0.0}),
        AgentLoopOutput([4, 5, 6], [11], [1], [-4.0], num_turns=2,
                        metrics={"tool_calls": 0.0, "tool_errors": 0.0, "bad_tool_calls": 2.0, "truncated": 1.0,
                                 "interaction_turns": 1.0, "tokenization_mismatch": 1.0}),
    ]


def test_padding_and_masks():
    batch = collate_agent_outputs(outputs(), prompt_length=4, response_length=5, pad_token_id=PAD)
    assert batch[keys.PROMPTS].tolist() == [[0, 0, 5, 6], [0, 4, 5, 6]]
    assert batch[keys.RESPONSES].tolist() == [[7, 8, 9, 10, 0], [11, 0, 0, 0, 0]]
    assert batch[keys.INPUT_IDS].tolist() == [[0, 0, 5, 6, 7, 8, 9, 10, 0], [0, 4, 5, 6, 11, 0, 0, 0, 0]]
    assert batch[keys.ATTENTION_MASK].tolist() == [[0, 0, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0, 0, 0]]
    assert batch[keys.RESPONSE_MASK].tolist() == [[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]]
    assert batch[keys.POSITION_IDS].tolist() == [[0, 0, 0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4, 5, 6, 7]]
    assert batch[keys.ROLLOUT_LOG_PROBS].tolist() == [[-1.0, -2.0, 0.0, -3.0, 0.0], [-4.0, 0.0, 0.0, 0.0, 0.0]]
    assert batch[keys.RESPONSES].dtype == torch.long and batch[keys.ROLLOUT_LOG_PROBS].dtype == torch.float32


def test_no_log_probs_when_one_output_lacks_them():
    outs = outputs()
    outs[1].response_logprobs = None
    assert keys.ROLLOUT_LOG_PROBS not in collate_agent_outputs(outs, 4, 5, PAD)


@pytest.mark.parametrize(
    "p, r, change, fragment",
    [
        (2, 5, None, "trajectory 1: prompt of 3 tokens exceeds prompt_length=2"),
        (4, 3, None, "trajectory 0: response of 4 tokens exceeds response_length=3"),
        (4, 5, "mask", "trajectory 0: response_mask has 3 entries for 4 response tokens"),
    ],
)
def test_errors(p, r, change, fragment):
    outs = outputs()
    if change == "mask":
        outs[0].response_mask = [1, 1, 0]
    with pytest.raises(ValueError, match=fragment):
        collate_agent_outputs(outs, p, r, PAD)


def test_aggregate_metrics():
    assert aggregate_metrics(outputs()) == {
        "multi_turn/num_turns/mean": 3.0,
        "multi_turn/num_turns/max": 4.0,
        "multi_turn/tool_calls/mean": 0.5,
        "multi_turn/tool_call_frac": 0.5,
        "multi_turn/interaction_turns/mean": 0.5,
        "multi_turn/tool_errors": 1.0,
        "multi_turn/bad_tool_calls": 2.0,
        "multi_turn/truncated_frac": 0.5,
        "multi_turn/tokenization_mismatch_frac": 0.5,
    }
    assert aggregate_metrics([]) == {}
