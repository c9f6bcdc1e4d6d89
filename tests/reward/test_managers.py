"""Reward managers: score placement, rm_scores pass-through, failures, custom functions, batch/dapo/prime."""

import math
import textwrap
import time

import numpy as np
import pytest
import torch

from _compose import SMALL, compose_config, typed_config_of
from rlpost import keys
from rlpost.reward import RewardFunctionError, check_reward_fn, load_reward_manager
from rlpost.reward.score import default_compute_score

# dapo buffer: max_response_length 12, buffer 4 -> responses longer than 8 tokens are penalised
BUFFER = ("reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
          "reward_model.overlong_buffer.penalty_factor=1.0", "reward_model.overlong_buffer.log=true")


def _overrides(manager: str, path: str | None, overrides: tuple[str, ...]) -> tuple[str, ...]:
    fn = (f"custom_reward_function.path={path}",) if path else ()
    return (*SMALL, "actor_rollout_ref.rollout.name=hf", "data.max_response_length=12",
            f"reward_model.reward_manager={manager}", *fn, *overrides)


def cfg(manager="naive", path=None, *overrides: str):
    """The validated full config with `reward_model.reward_manager=manager` and the reward file `path`."""
    return compose_config(*_overrides(manager, path, overrides))


def write_fn(tmp_path, body, filename="my_reward.py"):
    path = tmp_path / filename
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_naive_places_score_on_last_valid_token(make_batch, tokenizer):
    data = make_batch(["#### 3", "#### 4", "#### 3 and some more words"], ["3", "3", "3"])
    lengths = data.batch[keys.RESPONSE_MASK].sum(-1)
    out = load_reward_manager(cfg(), tokenizer)(data)
    assert out.shape == data.batch[keys.RESPONSES].shape and out.dtype == torch.float32
    assert out[0, lengths[0] - 1] == 1.0 and out[0].sum() == 1.0
    assert out[1].sum() == 0.0 and out[2].sum() == 0.0


def test_return_dict_and_extra_info(make_batch, tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": 0.5, "acc": solution_str.strip() == "#### " + ground_truth}
    """)
    data = make_batch(["#### 3", "#### 4"], ["3", "3"])
    out = load_reward_manager(cfg(path=path), tokenizer)(data, return_dict=True)
    assert out["reward_tensor"].sum().item() == pytest.approx(1.0)
    assert out["reward_extra_info"] == {"acc": [True, False]}


def test_rm_scores_pass_through_without_calling_rules(make_batch, tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            raise AssertionError("rule function must not run when rm_scores exist")
    """)
    rm = torch.arange(24, dtype=torch.float32).reshape(2, 12)
    data = make_batch(["#### 3", "#### 4"], ["3", "3"], extra={keys.RM_SCORES: rm})
    for manager in ("naive", "dapo", "batch"):
        out = load_reward_manager(cfg(manager, path=path), tokenizer)(data, return_dict=True)
        assert torch.equal(out["reward_tensor"], rm)


def test_raising_reward_fn_names_sample(make_batch, tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if ground_truth == "bad":
                raise ZeroDivisionError("boom")
            return 1.0
    """)
    data = make_batch(["#### 3", "#### 4"], ["3", "bad"], data_sources=["a/src", "b/src"])
    with pytest.raises(RewardFunctionError, match=r"data_source='b/src', sample 1: ZeroDivisionError") as err:
        load_reward_manager(cfg(path=path), tokenizer)(data)
    assert "ZeroDivisionError: boom" in err.value.traceback_str and "my_reward.py" in str(err.value)


@pytest.mark.parametrize("bad", ["float('nan')", "float('inf')", "{'acc': 1}", "'high'"])
def test_invalid_scores_raise(make_batch, tokenizer, tmp_path, bad):
    path = write_fn(tmp_path, f"""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return {bad}
    """)
    with pytest.raises(RewardFunctionError, match="sample 0"):
        load_reward_manager(cfg(path=path), tokenizer)(make_batch(["#### 3"], ["3"]))


def test_custom_name_and_kwargs(make_batch, tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        def other(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            return 1.0 + bonus + extra_info["index"]
    """)
    # typed config: validation leaves the example kwargs at null (validate_config would drop them)
    typed = typed_config_of(*_overrides("naive", path, ("custom_reward_function.name=other",
                                                          "+custom_reward_function.reward_kwargs.bonus=0.25")))
    assert typed.custom_reward_function.reward_kwargs["tool_bonus"] is None  # null entries are not passed
    out = load_reward_manager(typed, tokenizer)(make_batch(["#### 3", "#### 3"], ["3", "3"]))
    assert out.sum(-1).tolist() == [1.25, 2.25]


def test_custom_errors_name_path_and_function(tokenizer, tmp_path):
    path = write_fn(tmp_path, "def helper(x):\n    return x\n")
    with pytest.raises(ValueError, match=r"custom_reward_function.name: 'compute_score' not found in .*my_reward.py.*helper"):
        load_reward_manager(cfg(path=path), tokenizer)
    with pytest.raises(FileNotFoundError, match="custom_reward_function.path: file not found: /no/such.py"):
        load_reward_manager(cfg(path="/no/such.py"), tokenizer)
    unvalidated = compose_config(*_overrides("naiv", None, ()), validate=False)  # start-up would refuse it
    with pytest.raises(ValueError, match="Unknown reward_manager 'naiv'.*Did you mean 'naive'"):
        load_reward_manager(unvalidated, tokenizer)


def test_batch_manager_calls_with_lists(make_batch, tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
            assert isinstance(solution_strs, list) and len(solution_strs) == 3
            return [float(len(s)) for s in solution_strs]
    """)
    out = load_reward_manager(cfg("batch", path=path), tokenizer)(make_batch(["#### 3", "#### 33", "x"], ["3"] * 3))
    assert out.sum(-1).tolist() == [6.0, 7.0, 1.0]


def test_dapo_overlong_penalty(make_batch, tokenizer):
    # expected length 12 - 4 = 8; length l > 8 gets -(l-8)/4 * penalty_factor
    texts = ["#### 3", "#### 3 " + "x " * 20]
    data = make_batch(texts, ["3", "3"])
    lengths = data.batch[keys.RESPONSE_MASK].sum(-1).tolist()
    assert lengths[1] == 12 and lengths[0] <= 8
    out = load_reward_manager(cfg("dapo", None, *BUFFER), tokenizer)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([1.0, 0.0 - (12 - 8) / 4])
    assert out["reward_extra_info"]["overlong"] == [False, True]
    with pytest.raises(ValueError, match="overlong_buffer.enable=True needs reward_model.reward_manager=dapo"):
        load_reward_manager(cfg("naive", None, *BUFFER), tokenizer)
    with pytest.raises(ValueError, match=r"overlong_buffer.len=0 must be in \(0, data.max_response_length=12\]"):
        load_reward_manager(cfg("dapo", None, *BUFFER, "reward_model.overlong_buffer.len=0"), tokenizer)


@pytest.mark.timeout(120)
def test_prime_parallel_and_timeout(make_batch, tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        import time
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if ground_truth == "hang":
                time.sleep(60)
            if ground_truth == "raise":
                raise KeyError("missing")
            return 1.0 if solution_str.strip() == "#### " + ground_truth else 0.0
    """)
    kwargs = ("+reward_model.reward_kwargs.num_processes=2", "+reward_model.reward_kwargs.timeout=3")  # manager's
    manager = load_reward_manager(cfg("prime", path, *kwargs), tokenizer)
    out = manager(make_batch(["#### 3", "#### 4", "#### 5"], ["3", "3", "hang"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["reward_timeout"] == [0, 0, 1]
    with pytest.raises(RewardFunctionError, match="sample 1") as err:
        manager(make_batch(["#### 3", "#### 4"], ["3", "raise"]))
    assert "KeyError" in err.value.traceback_str


def test_check_reward_fn_preflight(tmp_path):
    from rlpost.reward.custom import RewardFnSpec

    rows = [{keys.DATA_SOURCE: "rlpost/arith", keys.REWARD_MODEL: {"ground_truth": "5"}, keys.EXTRA_INFO: {}},
            {keys.DATA_SOURCE: "openai/gsm8k", keys.REWARD_MODEL: {"ground_truth": "7"}, keys.EXTRA_INFO: {}},
            {keys.DATA_SOURCE: "lighteval/MATH", keys.REWARD_MODEL: {"ground_truth": "\\frac12"}, keys.EXTRA_INFO: {}}]
    assert check_reward_fn(RewardFnSpec().resolve(), rows) == [1.0, 1.0, 1.0]
    rows.append({keys.DATA_SOURCE: "unknown/src", keys.REWARD_MODEL: {"ground_truth": "1"}, keys.EXTRA_INFO: {}})
    with pytest.raises(RewardFunctionError, match="'unknown/src', sample 3.*known data sources"):
        check_reward_fn(RewardFnSpec().resolve(), rows)
    assert math.isfinite(check_reward_fn(RewardFnSpec().resolve(), rows, n=1)[0])


def test_check_reward_fn_with_batch_manager(tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
            return [float("nan") if g == "2" else 1.0 for g in ground_truths]
    """)
    manager = load_reward_manager(cfg("batch", path=path), tokenizer)
    rows = [{keys.DATA_SOURCE: "x", keys.REWARD_MODEL: {"ground_truth": g}, keys.EXTRA_INFO: {}} for g in "12"]
    assert check_reward_fn(manager, rows, n=1) == [1.0]
    with pytest.raises(RewardFunctionError, match="sample 1: non-finite score nan"):
        check_reward_fn(manager, rows)


def test_multi_turn_rows_score_the_last_model_token_with_the_conversation(make_batch, tokenizer):
    """A multi-turn response: model call | tool turn (response_mask 0) | model answer. The whole conversation
    is decoded, the score lands on the last real token, and extra_info gets num_turns and tool_calls."""
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((solution_str, dict(extra_info)))
        return default_compute_score(data_source, solution_str, ground_truth, extra_info)

    call = tokenizer("call 6*7", add_special_tokens=False)["input_ids"]
    tool = tokenizer(" 42 ", add_special_tokens=False)["input_ids"]
    answer = tokenizer("#### 42", add_special_tokens=False)["input_ids"]
    batch = make_batch(["call 6*7 42 #### 42"], ["42"], response_len=32)
    n = len(call) + len(tool) + len(answer)
    ids = torch.full((1, 32), tokenizer.pad_token_id)
    ids[0, :n] = torch.tensor(call + tool + answer)
    mask = torch.zeros(1, 32, dtype=torch.long)
    mask[0, :len(call)] = 1
    mask[0, len(call) + len(tool):n] = 1
    batch.batch[keys.RESPONSES], batch.batch[keys.RESPONSE_MASK] = ids, mask
    batch.batch[keys.ATTENTION_MASK][:, -32:] = (torch.arange(32) < n).long()
    batch.non_tensor_batch.update({keys.NUM_TURNS: np.array([4]), keys.AGENT_METRICS: _objects([{"tool_calls": 1.0}]),
                                   keys.TOOL_REWARDS: _objects([{"calculator": 0.5}])})
    manager = load_reward_manager(typed_config_of(*_overrides("naive", None, ())), tokenizer)
    manager.compute_score = spy
    out = manager(batch)
    assert out[0, n - 1] == 1.0 and out.sum() == 1.0  # on the answer's last token, not at response_mask.sum()
    text, extra_info = seen[0]
    assert text.endswith("#### 42") and " 42 " in text
    assert extra_info == {"index": 0, "num_turns": 4, "tool_calls": 1, "rollout_reward_scores": {"calculator": 0.5}}


def _objects(values):
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# 0.6 s a sample (slow: worker processes take over after the first), 60 s for the ground truth "hang"
SLOW_FN = """
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(60 if ground_truth == "hang" else 0.6)
        return 1.0 if solution_str.strip() == "#### " + ground_truth else 0.0
"""


@pytest.mark.timeout(120)
def test_slow_reward_fn_moves_the_naive_manager_to_worker_processes(make_batch, tokenizer, tmp_path, caplog):
    """The first batch finds the function slow after one sample and scores the rest in 4 processes; later
    batches go straight to the processes, where a hung sample times out, is flagged and warned."""
    path = write_fn(tmp_path, SLOW_FN)
    manager = load_reward_manager(cfg("naive", path, "+reward_model.reward_kwargs.num_processes=4",
                                      "+reward_model.reward_kwargs.timeout=2"), tokenizer)
    data = make_batch(["#### 3", "#### 4", "#### 5", "#### 6", "#### 7"], ["3", "3", "5", "6", "7"])
    start = time.perf_counter()
    out = manager(data, return_dict=True)
    assert time.perf_counter() - start < 5 * 0.6  # serial would take 3.0 s
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert out["reward_extra_info"]["reward_timeout"] == [0] * 5
    moved = [r.getMessage() for r in caplog.records if "worker processes from now on" in r.getMessage()]
    assert len(moved) == 1 and "reward_model.reward_kwargs.timeout=2.0s" in moved[0], moved
    out = manager(make_batch(["#### 3", "#### 4"], ["3", "hang"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["reward_extra_info"]["reward_timeout"] == [0, 1]
    assert any("timed out" in r.getMessage() and "sample 1" in r.getMessage() for r in caplog.records)
    assert len([r for r in caplog.records if "worker processes from now on" in r.getMessage()]) == 1


def test_fast_reward_fn_stays_in_process_and_batch_manager_refuses_pool_kwargs(make_batch, tokenizer):
    manager = load_reward_manager(cfg("naive", None), tokenizer)
    out = manager(make_batch(["#### 3"], ["3"]), return_dict=True)
    assert out["reward_tensor"].sum().item() == 1.0 and "reward_timeout" not in out["reward_extra_info"]
    assert manager._parallel is False
    with pytest.raises(ValueError, match=r"not supported yet: reward_model.reward_kwargs \['timeout'\] for "
                                         "reward_manager=batch"):
        load_reward_manager(cfg("batch", None, "+reward_model.reward_kwargs.timeout=3"), tokenizer)


@pytest.mark.timeout(120)
def test_dapo_manager_records_plain_scores_as_acc_in_process_and_in_worker_processes(make_batch, tokenizer,
                                                                                   tmp_path):
    """verl's dapo manager keeps a scorer's plain number as the extra value 'acc' (CoDaPO's correctness). So does
    rlpost's, in this process, in the worker processes a slow function moves to, and for a time-out (0.0)."""
    path = write_fn(tmp_path, SLOW_FN)
    manager = load_reward_manager(cfg("dapo", path, "+reward_model.reward_kwargs.num_processes=2",
                                      "+reward_model.reward_kwargs.timeout=2"), tokenizer)
    out = manager(make_batch(["#### 3", "#### 4", "#### 5"], ["3", "3", "5"]), return_dict=True)
    assert manager._parallel  # the first sample in process, the others in the pool
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0, 1.0]
    out = manager(make_batch(["#### 3", "#### 4"], ["3", "hang"]), return_dict=True)
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0] and out["reward_extra_info"]["reward_timeout"] == [0, 1]


def test_a_non_finite_score_names_the_data_row_and_the_response(make_batch, tokenizer, tmp_path):
    path = write_fn(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float("inf") if ground_truth == "4" else 1.0
    """)
    data = make_batch(["#### 3", "#### 4", "#### 5"], ["3", "4", "5"])
    data.non_tensor_batch[keys.INDEX] = np.array([40, 41, 42], dtype=object)  # the rows in the data file
    with pytest.raises(RewardFunctionError) as err:
        load_reward_manager(cfg("naive", path), tokenizer)(data)
    assert ("data_source='rlpost/arith', sample 1: non-finite score inf for data row 41; response: '#### 4'; "
            "return a finite number") in str(err.value)
