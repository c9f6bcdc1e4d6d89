"""Start-up rules of a generative reward model (`rlpost.trainer.config.judge_rules`): which configs are a judge,
what is refused with one line naming the key, and judge keys that a run would not read."""

import pytest

from rlpost.trainer.config import ConfigError, ConfigWarning, need_reward_model, typed_config
from rlpost.trainer.config.roles import generative_judge

pytestmark = pytest.mark.timeout(300)

SERVED = {"reward_model.enable": True, "reward_model.judge.enable": True, "reward_model.model.path": "/judge",
          "reward_model.rollout.name": "vllm", "reward_model.enable_resource_pool": True, "reward_model.nnodes": 1,
          "reward_model.n_gpus_per_node": 1}


def test_what_is_a_judge(small_cfg):
    typed = typed_config(small_cfg(SERVED))
    assert generative_judge(typed) and not need_reward_model(typed)  # no FSDP reward-model worker is created
    verl_genrm = {**SERVED, "reward_model.judge.enable": False, "reward_model.use_reward_loop": True,
                  "custom_reward_function.path": "/genrm.py"}
    assert generative_judge(typed_config(small_cfg(verl_genrm)))
    discriminative = typed_config(small_cfg({"reward_model.enable": True, "reward_model.model.path": "/rm"}))
    assert need_reward_model(discriminative) and not generative_judge(discriminative)
    at_url = {"reward_model.enable": True, "reward_model.judge.enable": True,
              "reward_model.judge.url": "http://judge:8000/v1", "reward_model.judge.model_name": "qwen"}
    assert typed_config(small_cfg(at_url)).reward_model.judge.url == "http://judge:8000/v1"


@pytest.mark.parametrize("values, message", [
    ({"reward_model.reward_manager": "dapo"},
     "not supported yet: reward_model.reward_manager=dapo with a generative reward model"),
    ({"reward_model.reward_kwargs": {"num_processes": 2}}, "not supported yet: reward_model.reward_kwargs="),
    ({"reward_model.rollout.tensor_model_parallel_size": 2},
     "not supported yet: reward_model.rollout.tensor_model_parallel_size=2 for the judge"),
    ({"reward_model.rollout.name": "sglang"}, "not supported yet: reward_model.rollout.name=sglang for the judge"),
    ({"reward_model.judge.api": "responses"}, "reward_model.judge.api=responses: the judge's API (chat, completions)"),
    ({"reward_model.judge.max_score": 0.0}, "reward_model.judge.max_score=0.0: the top of the judge's scale is > 0"),
    ({"reward_model.judge.max_concurrency": 0}, "reward_model.judge.max_concurrency=0: must be an integer >= 1"),
    ({"reward_model.judge.url": "judge:8000", "reward_model.judge.model_name": "m",
      "reward_model.enable_resource_pool": False}, "reward_model.judge.url=judge:8000: an OpenAI-compatible base URL"),
    ({"reward_model.judge.url": "http://j/v1", "reward_model.judge.model_name": "m"},
     "reward_model.enable_resource_pool=true, reward_model.judge.url=http://j/v1: a judge at a URL"),
    ({"reward_model.enable": False}, "reward_model.judge.enable=true, reward_model.enable=false"),
])
def test_refused_with_one_line_naming_the_key(small_cfg, values, message):
    with pytest.raises(ConfigError) as err:
        typed_config(small_cfg({**SERVED, **values}))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value) and str(err.value).rstrip(".").split("; use ")[-1]


def test_judge_keys_a_run_does_not_read_get_one_notice(small_cfg):
    with pytest.warns(ConfigWarning, match=r"^reward_model.judge.parser, reward_model.judge.max_tokens set but not "
                                           r"read: no generative reward model"):
        typed_config(small_cfg({"reward_model.judge.parser": "json", "reward_model.judge.max_tokens": 4}))
    verl_genrm = {**SERVED, "reward_model.judge.enable": False, "reward_model.use_reward_loop": True,
                  "custom_reward_function.path": "/genrm.py", "reward_model.judge.prompt_template": "{response}?",
                  "reward_model.judge.max_concurrency": 8}
    with pytest.warns(ConfigWarning, match=r"^reward_model.judge.prompt_template set but not read: "
                                           r"custom_reward_function /genrm.py writes its own judge requests"):
        typed = typed_config(small_cfg(verl_genrm))
    assert typed.reward_model.judge.max_concurrency == 8  # read: it bounds the function's calls in flight
