"""Agent-loop registry (built-ins, user loops from YAML, unknown names), AgentLoopConfig validation, the
single-turn loop, and building resources from the YAML files."""

import asyncio
from pathlib import Path

import pytest
from _agent_doubles import ScriptedEngine
from omegaconf import OmegaConf

import rlpost
from rlpost.agent import (
    AGENT_LOOPS,
    AgentLoopBase,
    AgentLoopConfig,
    AgentLoopOutput,
    AgentResources,
    check_agent_names,
    load_agent_loops,
    run_agent_loops,
)
from rlpost.tools.utils.yaml_entries import ConfigEntryError


class EchoLoop(AgentLoopBase):
    """A user loop: returns its constructor kwarg as the only response token."""

    async def run(self, sampling_params, **sample):
        return AgentLoopOutput(prompt_ids=[1], response_ids=[self.kwargs["token"]], response_mask=[1], num_turns=2)


def test_builtin_loops():
    assert {"single_turn_agent", "tool_agent"} <= set(AGENT_LOOPS.names())


def test_user_loop_from_yaml(tmp_path, chat_tokenizer):
    path = tmp_path / "loops.yaml"
    path.write_text("- name: echo_test\n  _target_: test_registry_and_config.EchoLoop\n  token: 9\n")
    try:
        assert load_agent_loops(path) == ["echo_test"]
        assert load_agent_loops(path) == ["echo_test"]  # loading the same file again is not a conflict
        config = AgentLoopConfig(response_length=8, default_agent_loop="echo_test")
        (out,) = asyncio.run(run_agent_loops([{"raw_prompt": []}], None, config, chat_tokenizer,
                                             resources=AgentResources()))
        assert out.response_ids == [9]
    finally:  # the registry is process-wide: later tests list the registered loops
        AGENT_LOOPS._entries.pop("echo_test", None)


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("- name: x\n  _target_: no_pkg.Loop\n",
         "file[0] (name 'x', _target_ 'no_pkg.Loop'): unknown agent loop class"),
        ("- name: x\n  _target_: collections.OrderedDict\n", "must subclass rlpost.agent.base.AgentLoopBase"),
        ("- _target_: test_registry_and_config.EchoLoop\n", "file[0]: each entry needs 'name' and '_target_'"),
        ("- name: tool_agent\n  _target_: test_registry_and_config.EchoLoop\n", "'tool_agent' is already registered"),
        ("loops: []\n", "expected a list under 'file'"),
    ],
)
def test_bad_agent_loop_yaml(tmp_path, body, fragment):
    path = tmp_path / "loops.yaml"
    path.write_text(body)
    with pytest.raises(ConfigEntryError) as err:
        load_agent_loops(path)
    assert str(err.value).startswith(f"{path}: ") and fragment in str(err.value)


def test_unknown_agent_names_listed():
    check_agent_names(["tool_agent", "single_turn_agent", None])
    with pytest.raises(ValueError, match=r"agent_name values \['a', 'b'\] are not registered.*'tool_agent'"):
        check_agent_names(["b", "tool_agent", "a", "a"])


def test_runner_refuses_unknown_agent_name_before_running(chat_tokenizer):
    engine = ScriptedEngine(chat_tokenizer, {"Q": ["x"]})
    rows = [{"raw_prompt": [{"role": "user", "content": "Q"}], "agent_name": "tool_agnt"}]
    with pytest.raises(ValueError, match="'tool_agnt'"):
        asyncio.run(run_agent_loops(rows, engine, AgentLoopConfig(response_length=8), chat_tokenizer,
                                    resources=AgentResources()))
    assert engine.calls == []


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"response_length": 0}, "response_length=0: must be a positive int"),
        ({"max_assistant_turns": 0}, "multi_turn.max_assistant_turns=0: must be a positive int or null"),
        ({"max_parallel_calls": 1.5}, "multi_turn.max_parallel_calls=1.5"),
        ({"tool_response_truncate_side": "top"}, "tool_response_truncate_side='top': must be one of"),
        ({"tokenization_sanity_check_mode": "off"}, "tokenization_sanity_check_mode='off'"),
        ({"format": "harmony"}, "multi_turn.format='harmony': must be one of ['gpt-oss', 'hermes', 'llama3', "),
        ({"tool_timeout_s": 0}, "tool_timeout_s=0: must be > 0"),
    ],
)
def test_config_validation(kwargs, fragment):
    with pytest.raises(ValueError) as err:
        AgentLoopConfig(**{"response_length": 16, **kwargs})
    assert fragment in str(err.value)


def test_config_from_rollout_node():
    rollout = OmegaConf.load(Path(rlpost.__file__).parent / "trainer/config/rollout/rollout.yaml")
    rollout.response_length = 64
    rollout.multi_turn.max_assistant_turns = 3
    rollout.multi_turn.tool_config_path = "tools.yaml"
    config = AgentLoopConfig.from_rollout_config(rollout, {"enable_thinking": False})
    assert (config.response_length, config.max_assistant_turns, config.max_user_turns) == (64, 3, None)
    assert (config.max_parallel_calls, config.max_tool_response_length, config.tool_response_truncate_side) == (
        1, 256, "middle")
    assert (config.tokenization_sanity_check_mode, config.format) == ("strict", "hermes")
    # no agent.default_agent_loop: tools are configured, so rows without agent_name run tool_agent
    assert (config.default_agent_loop, config.tool_config_path) == ("tool_agent", "tools.yaml")
    assert config.template_kwargs == {"enable_thinking": False} and config.tool_timeout_s == 60.0
    rollout.multi_turn.tool_config_path = None
    assert AgentLoopConfig.from_rollout_config(rollout).default_agent_loop == "single_turn_agent"
    rollout.agent.default_agent_loop = "tool_agent"
    assert AgentLoopConfig.from_rollout_config(rollout).default_agent_loop == "tool_agent"


def test_resources_from_yaml(tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n"
                     "    config: {type: native}\n")
    inter = tmp_path / "interaction.yaml"
    inter.write_text("interaction:\n  - name: gsm8k\n    class_name: "
                     "rlpost.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n")
    res = AgentResources.from_config(AgentLoopConfig(response_length=8, tool_config_path=str(tools),
                                                     interaction_config_path=str(inter)))
    assert list(res.tools) == ["calculator"] and list(res.interactions) == ["gsm8k"]
    with pytest.raises(ValueError, match="'nope'"):
        AgentResources.from_config(AgentLoopConfig(response_length=8, default_agent_loop="nope"))


def test_single_turn_uses_raw_prompt_ids(chat_tokenizer):
    tok = chat_tokenizer
    engine = ScriptedEngine(tok, {"Q": ["#### 408"]})
    prompt_ids = tok.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    rows = [{"raw_prompt_ids": prompt_ids}, {"raw_prompt": [{"role": "user", "content": "Q"}]}]
    short = AgentLoopConfig(response_length=3)
    outs = asyncio.run(run_agent_loops(rows, engine, AgentLoopConfig(response_length=50), tok,
                                       resources=AgentResources()))
    assert outs[0].prompt_ids == prompt_ids == outs[1].prompt_ids
    expected = tok.encode("#### 408", add_special_tokens=False) + [tok.eos_token_id]
    assert outs[0].response_ids == expected and outs[0].response_mask == [1] * len(expected)
    assert outs[0].response_logprobs == [-0.1] * len(expected)
    assert outs[0].num_turns == 2 and outs[0].metrics["truncated"] == 0.0
    (cut,) = asyncio.run(run_agent_loops(rows[:1], engine, short, tok, resources=AgentResources()))
    assert cut.response_ids == expected[:3] and cut.metrics["truncated"] == 1.0
