"""verl's small helpers: temp_env_var, timeout_limit (child process and signal modes), dict helpers."""

import os
import time

import pytest

from rlpost.utils.py_functional import append_to_dict, rename_dict, temp_env_var, timeout_limit, union_two_dict


def test_temp_env_var_restores_or_removes(monkeypatch):
    monkeypatch.setenv("RLPOST_T_SET", "before")
    monkeypatch.delenv("RLPOST_T_UNSET", raising=False)
    with temp_env_var("RLPOST_T_SET", "inside"), temp_env_var("RLPOST_T_UNSET", "x"):
        assert os.environ["RLPOST_T_SET"] == "inside" and os.environ["RLPOST_T_UNSET"] == "x"
    assert os.environ["RLPOST_T_SET"] == "before" and "RLPOST_T_UNSET" not in os.environ
    with pytest.raises(KeyError), temp_env_var("RLPOST_T_SET", "inside"):
        raise KeyError("restored on error too")
    assert os.environ["RLPOST_T_SET"] == "before"


def _square(x):
    return x * x


def _sleep(seconds):
    time.sleep(seconds)
    return "late"


def _fail():
    raise KeyError("from the child")


@pytest.mark.timeout(60)
def test_timeout_limit_in_a_child_process():
    assert timeout_limit(10)(_square)(7) == 49
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="_sleep timed out after 0.5 s"):
        timeout_limit(0.5)(_sleep)(30)
    assert time.monotonic() - start < 10
    with pytest.raises(KeyError, match="from the child"):
        timeout_limit(10)(_fail)()


def test_timeout_limit_with_signals():
    assert timeout_limit(5, use_signals=True)(_square)(3) == 9
    with pytest.raises(TimeoutError, match="signal"):
        timeout_limit(0.2, use_signals=True)(_sleep)(5)


def test_dict_helpers():
    data = {}
    append_to_dict(data, {"a": 1}, prefix="p/")
    append_to_dict(data, {"a": 2})
    assert data == {"p/a": [1], "a": [2]}
    assert union_two_dict({"a": 1}, {"b": 2, "a": 1}) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="key 'a' is 1 in one dict and 3"):
        union_two_dict({"a": 1}, {"a": 3})
    assert rename_dict({"x": 1}, "val/") == {"val/x": 1}
