"""Reward managers written against verl's API: a class in a file of the user's (`reward.reward_manager.source=
importlib`, gets `compute_score=`), a subclass of a built-in manager that passes the function positionally, and
verl's module paths of the managers."""

import importlib
from pathlib import Path

import pytest

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.reward import RewardFnSpec, load_reward_manager
from rlpost.utils.import_utils import UserCodeError
from rlpost.trainer.config import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/reward_manager/offset_reward_manager.py"


def cfg(*overrides):
    return compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", "data.max_response_length=12", *overrides)


def importlib_source(path=EXAMPLE, name="OffsetRewardManager"):
    return ("reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={path}",
            f"reward.reward_manager.module.name={name}")


def test_a_manager_class_from_a_file_gets_the_reward_function_and_its_kwargs(make_batch, tokenizer):
    data = make_batch(["#### 3", "#### 4"], ["3", "3"])
    manager = load_reward_manager(cfg(*importlib_source(), "+reward_model.reward_kwargs.offset=0.5"), tokenizer)
    assert type(manager).__name__ == "OffsetRewardManager" and manager.reward_fn_key == keys.DATA_SOURCE
    out = manager(data, return_dict=True)
    last = data.batch[keys.RESPONSE_MASK].sum(-1) - 1
    assert [out["reward_tensor"][i, last[i]].item() for i in range(2)] == [1.5, 0.5]  # built-in arith scorer + 0.5
    assert out["reward_extra_info"] == {"base_score": [1.0, 0.0]}
    assert out["reward_tensor"].sum().item() == pytest.approx(2.0)


def test_a_custom_reward_function_reaches_the_file_manager(make_batch, tokenizer, tmp_path):
    fn = tmp_path / "fn.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.25\n")
    manager = load_reward_manager(cfg(*importlib_source(), f"custom_reward_function.path={fn}"), tokenizer)
    assert manager(make_batch(["#### 3"], ["3"])).sum().item() == pytest.approx(0.25)


def test_a_verl_style_subclass_of_a_builtin_manager(make_batch, tokenizer):
    from rlpost.workers.reward_manager import NaiveRewardManager, register

    @register("verl_style_naive_test")
    class Doubled(NaiveRewardManager):
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **kwargs):
            super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)  # verl passes it positionally

        def __call__(self, data, return_dict=False):
            out = super().__call__(data, return_dict=True)
            return {**out, "reward_tensor": 2 * out["reward_tensor"]} if return_dict else 2 * out["reward_tensor"]

    try:
        manager = load_reward_manager(cfg("reward_model.reward_manager=verl_style_naive_test"), tokenizer)
        # the function it got carries its spec: worker processes can still rebuild it
        assert manager.spec == RewardFnSpec() and manager._can_parallelise() is (manager.num_processes > 1)
        assert manager(make_batch(["#### 3", "#### 4"], ["3", "3"])).sum().item() == 2.0
        default = NaiveRewardManager(tokenizer, 0)  # verl's default: the built-in scorers
        assert default(make_batch(["#### 3"], ["3"])).sum().item() == 1.0
        plain = NaiveRewardManager(tokenizer, 0, lambda **kw: 0.5)  # a function of the user's own: no spec
        assert plain.spec is None and plain(make_batch(["#### 3"], ["3"])).sum().item() == 0.5
        with pytest.raises(ValueError, match="not supported yet: reward_model.reward_kwargs num_processes/timeout"):
            NaiveRewardManager(tokenizer, 0, lambda **kw: 0.5, timeout=3)
    finally:
        from rlpost.reward.managers import REWARD_MANAGERS

        REWARD_MANAGERS._entries.pop("verl_style_naive_test")


def test_what_cannot_be_loaded_is_named(tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="reward.reward_manager.source=importlib, reward.reward_manager.module.path"
                                          "=null"):
        cfg("reward.reward_manager.source=importlib")
    with pytest.raises(ConfigError, match="reward.reward_manager.source=.*importlib"):
        cfg("reward.reward_manager.source=importlb")
    with pytest.raises(FileNotFoundError, match="reward.reward_manager.module.path: file not found"):
        load_reward_manager(cfg(*importlib_source(path=tmp_path / "none.py")), tokenizer)
    with pytest.raises(UserCodeError, match="reward.reward_manager.module.name: 'Missing' not found"):
        load_reward_manager(cfg(*importlib_source(name="Missing")), tokenizer)
    not_class = tmp_path / "fn_manager.py"
    not_class.write_text("def manager(**kwargs):\n    return None\n")
    with pytest.raises(UserCodeError, match="'manager' in .* is a function, not a reward manager class"):
        load_reward_manager(cfg(*importlib_source(path=not_class, name="manager")), tokenizer)
    bad = tmp_path / "bad_manager.py"
    bad.write_text("class M:\n    def __init__(self, tokenizer, num_examine, compute_score):\n        pass\n")
    with pytest.raises(ValueError, match="reward manager M cannot be built with tokenizer=, num_examine=, "
                                         "compute_score=, reward_fn_key="):
        load_reward_manager(cfg(*importlib_source(path=bad, name="M")), tokenizer)


def test_a_verl_style_prime_subclass_keeps_its_worker_processes(make_batch, tokenizer):
    from rlpost.reward.managers import REWARD_MANAGERS
    from rlpost.workers.reward_manager import PrimeRewardManager, register

    @register("verl_style_prime_test")
    class Prime(PrimeRewardManager):
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **kwargs):
            super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, num_processes=2)

    try:
        manager = load_reward_manager(cfg("reward_model.reward_manager=verl_style_prime_test"), tokenizer)
        assert manager.spec == RewardFnSpec()
        assert manager(make_batch(["#### 3", "#### 4"], ["3", "3"])).sum().item() == 1.0  # scored in 2 processes
    finally:
        REWARD_MANAGERS._entries.pop("verl_style_prime_test")


def test_a_manager_file_is_read_only_with_importlib(tokenizer):
    with pytest.raises(ConfigError, match="reward.reward_manager.module.path=/x.py, reward.reward_manager.source="
                                          "register: the file is read only with source=importlib"):
        cfg("reward.reward_manager.module.path=/x.py")


@pytest.mark.parametrize("module, names", [
    ("abstract", ["AbstractRewardManager"]), ("registry", ["register", "get_reward_manager_cls"]),
    ("naive", ["NaiveRewardManager"]), ("dapo", ["DAPORewardManager"]), ("batch", ["BatchRewardManager"]),
    ("prime", ["PrimeRewardManager"]),
])
def test_verl_module_paths(module, names):
    from rlpost.workers.reward_manager import AbstractRewardManager, NaiveRewardManager

    mod = importlib.import_module(f"rlpost.workers.reward_manager.{module}")
    assert all(hasattr(mod, n) for n in names)
    assert issubclass(NaiveRewardManager, AbstractRewardManager)


def test_verl_registry_dict_and_compute_score_timeout(tmp_path):
    from rlpost.reward.managers import NaiveRewardManager
    from rlpost.workers.reward_manager import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

    assert REWARD_MANAGER_REGISTRY["naive"] is NaiveRewardManager

    @register("my_dict_visible_manager")
    class Mine(NaiveRewardManager):
        pass

    try:
        assert REWARD_MANAGER_REGISTRY["my_dict_visible_manager"] is Mine
        assert get_reward_manager_cls("my_dict_visible_manager") is Mine
    finally:
        del REWARD_MANAGER_REGISTRY["my_dict_visible_manager"]
    fn = tmp_path / "fn.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    # verl's name of the per-sample time-out is the manager's `timeout`
    assert NaiveRewardManager(None, 0, RewardFnSpec(str(fn)), compute_score_timeout=1.5).timeout == 1.5
    with pytest.raises(ValueError, match="timeout=2.0 and compute_score_timeout=1.5 are one setting"):
        NaiveRewardManager(None, 0, RewardFnSpec(str(fn)), timeout=2.0, compute_score_timeout=1.5)
