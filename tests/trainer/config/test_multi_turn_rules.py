"""Start-up rules of multi-turn rollouts: the keys are accepted with multi_turn.enable, refused (or flagged)
where they cannot work, and the tool-use reward kwargs need multi-turn rollouts."""

import warnings

import pytest

from rlpost.trainer.config import ConfigError, ConfigWarning, validate_config

ARR = "actor_rollout_ref"
MT = f"{ARR}.rollout.multi_turn"


def test_multi_turn_keys_are_accepted(small_cfg):
    cfg = small_cfg({f"{MT}.enable": True, f"{ARR}.rollout.name": "hf", f"{MT}.tool_config_path": "/t.yaml",
                     f"{MT}.interaction_config_path": "/i.yaml", f"{MT}.max_assistant_turns": 3,
                     f"{MT}.tool_timeout_s": 5.0, f"{ARR}.rollout.agent.agent_loop_config_path": "/a.yaml",
                     f"{ARR}.rollout.agent.default_agent_loop": "tool_agent",
                     "custom_reward_function.reward_kwargs.use_tool_bonus": True,
                     "custom_reward_function.reward_kwargs.tool_bonus": 0.1,
                     "custom_reward_function.reward_kwargs.multi_tool_penalty": 0.05})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        validate_config(cfg)
    assert cfg.data.return_raw_chat is True and cfg.data.tool_config_path == "/t.yaml"  # both follow multi_turn


@pytest.mark.parametrize(("name", "device"), [("sglang", "cuda"), ("vllm", "cuda"), ("vllm", "cpu")])
@pytest.mark.parametrize("tp", [1, 2])
def test_multi_turn_runs_with_tensor_parallel_engines(small_cfg, name, device, tp):
    cfg = validate_config(small_cfg({f"{MT}.enable": True, f"{ARR}.rollout.name": name, "trainer.device": device,
                                     f"{ARR}.rollout.tensor_model_parallel_size": tp}))
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.name, rollout.tensor_model_parallel_size, rollout.multi_turn.enable) == (name, tp, True)


def test_agent_num_workers_is_accepted_with_a_notice(small_cfg):
    with pytest.warns(ConfigWarning, match=r"agent.num_workers=2 accepted: rlpost runs the agent loops of each "
                                           "rollout worker on one asyncio event loop"):
        validate_config(small_cfg({f"{MT}.enable": True, f"{ARR}.rollout.agent.num_workers": 2}))


RULES = [
    ({f"{MT}.enable": True, f"{ARR}.rollout.name": "hf", f"{ARR}.rollout.tensor_model_parallel_size": 2},
     f"not supported yet: {ARR}.rollout.tensor_model_parallel_size=2 with {MT}.enable=true and "
     f"{ARR}.rollout.name=hf: tensor-parallel agent loops run on the vllm or sglang engine; use "
     f"{ARR}.rollout.tensor_model_parallel_size=1 or {ARR}.rollout.name=vllm."),
    ({f"{MT}.enable": True, "data.return_raw_chat": False},
     f"{MT}.enable=true, data.return_raw_chat=false: agent loops render each conversation from the chat messages "
     "of the row; use data.return_raw_chat=true."),
    ({f"{ARR}.rollout.agent.default_agent_loop": "tool_agent"},
     f"{ARR}.rollout.agent.default_agent_loop=tool_agent, {MT}.enable=false: agent loops, tools and interactions "
     f"run only in multi-turn rollouts; use {MT}.enable=true."),
    ({f"{MT}.enable": True, f"{MT}.format": "gpt_oss"},
     f"{MT}.format=gpt_oss: must be one of gpt-oss, hermes, llama3, mistral, pythonic, qwen, qwen25; "
     f"use {MT}.format=gpt-oss."),
    ({f"{MT}.enable": True, f"{MT}.completion_callback": "m.f"},
     f"not supported yet: {MT}.completion_callback=m.f (the multi-turn completion callback is not built)"),
    ({f"{MT}.enable": True, f"{MT}.tool_timeout_s": 0.0}, f"{MT}.tool_timeout_s=0.0: must be > 0"),
    ({"custom_reward_function.reward_kwargs.use_tool_bonus": True,
      "custom_reward_function.reward_kwargs.tool_bonus": 0.1},
     "tool-use shaping counts the tool calls of multi-turn rollouts; use " f"{MT}.enable=true."),
    ({f"{MT}.enable": True, "custom_reward_function.reward_kwargs.use_tool_bonus": True},
     "custom_reward_function.reward_kwargs.use_tool_bonus=true, custom_reward_function.reward_kwargs.tool_bonus=null: "
     "the bonus needs a size"),
    ({f"{MT}.enable": True, "custom_reward_function.reward_kwargs.tool_bonus": 0.2},
     "custom_reward_function.reward_kwargs.tool_bonus=0.2, custom_reward_function.reward_kwargs.use_tool_bonus=null: "
     "the bonus is paid only when it is switched on"),
]


@pytest.mark.parametrize(("values", "message"), RULES)
def test_rule(small_cfg, values, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        with pytest.raises(ConfigError) as err:
            validate_config(small_cfg(values))
    assert message in str(err.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["gpt-oss", "llama3", "mistral", "pythonic", "qwen"])
def test_every_registered_format_validates(small_cfg, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        cfg = validate_config(small_cfg({f"{MT}.enable": True, f"{MT}.format": fmt}))
    assert cfg.actor_rollout_ref.rollout.multi_turn.format == fmt
