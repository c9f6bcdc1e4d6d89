"""Tests for rlpost.utils.registry.Registry."""

from enum import Enum

import pytest

from rlpost.utils.registry import Registry


class _Color(str, Enum):
    RED = "red"


def test_register_get_names_contains():
    reg = Registry("widget")

    @reg.register("b")
    def fb():
        return 2

    @reg.register(_Color.RED)
    def fr():
        return 1

    assert reg.get("b") is fb
    assert reg.get(_Color.RED) is fr and reg.get("red") is fr
    assert reg.names() == ["b", "red"]
    assert "b" in reg and _Color.RED in reg and "zzz" not in reg and 3 not in reg
    assert len(reg) == 2


def test_unknown_name_lists_valid_and_suggests_nearest():
    reg = Registry("policy loss")
    reg.register("vanilla")(object())
    reg.register("gspo")(object())
    with pytest.raises(ValueError) as err:
        reg.get("vanila")
    msg = str(err.value)
    assert "Unknown policy loss 'vanila'" in msg
    assert "['gspo', 'vanilla']" in msg
    assert "Did you mean 'vanilla'?" in msg
    with pytest.raises(ValueError, match="Valid names") as err2:
        reg.get("qqqqqqq")
    assert "Did you mean" not in str(err2.value)


def test_duplicate_and_bad_names_raise():
    reg = Registry("thing")
    obj = object()
    reg.register("x")(obj)
    reg.register("x")(obj)  # same object again: idempotent
    assert reg.get("x") is obj
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x")(object())
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
