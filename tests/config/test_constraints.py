"""The value constraints on the schema's fields: where they sit, what they refuse, and that each
suggested fix satisfies its own rule."""

import dataclasses

import pytest
from _compose import typed_config_of

from rlpost.config import constraints as C
from rlpost.config.schema_workers import OptimConfig
from rlpost.trainer.config import ConfigError

ARR = "actor_rollout_ref"


def test_constraints_sit_on_the_fields():
    rules = C.field_constraints(OptimConfig)
    assert rules["lr"] == (C.NON_NEGATIVE,)
    assert rules["betas"] == (C.BETAS,)
    assert rules["min_lr_ratio"] == (C.CLOSED_UNIT,)
    assert "lr_scheduler" not in rules  # a choice, checked against its registry elsewhere


def test_default_config_has_no_violation():
    assert list(C.violations(typed_config_of())) == []


@pytest.mark.parametrize("key, value, rule", [
    (f"{ARR}.rollout.n", 0, "must be an integer >= 1"),
    ("critic.optim.lr", -1e-5, "must be >= 0"),  # the same class as the actor's optimizer: one declaration
    (f"{ARR}.rollout.gpu_memory_utilization", 1.5, r"must be in \(0, 1\]"),
    ("trainer.save_freq", 0, "must be a number of steps >= 1, or -1 for never"),
    (f"{ARR}.actor.clip_ratio_c", 1.0, "the dual-clip constant must be > 1"),
])
def test_a_bad_value_is_named_with_a_fix(key, value, rule):
    with pytest.raises(ConfigError, match=rf"^{key}={value}: {rule}; use {key}="):
        typed_config_of(f"{key}={value}")


def test_null_passes_only_where_allowed():
    typed = typed_config_of("trainer.total_training_steps=null")
    assert typed.trainer.total_training_steps is None
    bad = dataclasses.replace(typed.trainer, total_epochs=None)
    found = list(C.violations(bad, "trainer."))
    assert [(k, r) for k, _, r in found] == [("trainer.total_epochs", C.POSITIVE)]


@pytest.mark.parametrize("rule, bad", [
    (C.POSITIVE, 0), (C.POSITIVE_OR_NULL, -3), (C.NON_NEGATIVE, -0.5), (C.POSITIVE_FLOAT, 0.0),
    (C.OPEN_UNIT, 0.0), (C.OPEN_UNIT, 7.0), (C.CLOSED_UNIT, -0.2), (C.CLOSED_UNIT, 1.5),
    (C.STEPS_OR_NEVER, 0), (C.TOP_K, -4), (C.ABOVE_ONE, 0.5), (C.BETAS, [0.9, 1.0]), (C.MODEL_RUNNER, "v3"),
])
def test_each_fix_satisfies_its_rule(rule, bad):
    assert not rule.ok(bad)
    fix = rule.fix(bad)
    if fix == "null":
        assert rule.allow_none
    else:
        value = [float(x) for x in fix.strip("[]").split(",")] if fix.startswith("[") else float(fix)
        assert rule.ok(value), (rule.rule, bad, fix)
