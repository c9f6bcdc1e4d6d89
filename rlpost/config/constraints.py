"""Value constraints carried on the typed schema's fields, and the one checker that applies them.

A field declares its constraint in its type: `ppo_epochs: Annotated[int, POSITIVE]`. `check_fields(config)`
walks every dataclass of a typed config and raises one `ValueError`-style message per the first value
outside its constraint, naming the dotted key, the rule and a value that works. Rules between keys live
in `rlpost.trainer.config.rules`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Constraint:
    """One value rule: `ok(value)` must hold (None passes when `allow_none`); `fix(value)` is a value to
    suggest, as written on the command line."""

    rule: str
    ok: Callable[[Any], bool]
    fix: Callable[[Any], str]
    allow_none: bool = False


def _unit(low: float) -> Callable[[Any], str]:
    return lambda v: str(min(max(v, low), 1.0))


POSITIVE = Constraint("must be an integer >= 1", lambda v: v >= 1, lambda v: "1")
POSITIVE_OR_NULL = Constraint("must be an integer >= 1 or null", lambda v: v >= 1, lambda v: "null",
                              allow_none=True)
NON_NEGATIVE = Constraint("must be >= 0", lambda v: v >= 0, lambda v: "0")
POSITIVE_FLOAT = Constraint("must be > 0", lambda v: v > 0, lambda v: "1.0")
POSITIVE_FLOAT_OR_NULL = Constraint("must be > 0 or null", lambda v: v > 0, lambda v: "null", allow_none=True)
OPEN_UNIT = Constraint("must be in (0, 1]", lambda v: 0 < v <= 1, _unit(0.1))
CLOSED_UNIT = Constraint("must be in [0, 1]", lambda v: 0 <= v <= 1, _unit(0.0), allow_none=True)
BELOW_ONE = Constraint("must be in [0, 1)", lambda v: 0 <= v < 1, lambda v: "0.0" if v < 0 else "0.5")
STEPS_OR_NEVER = Constraint("must be a number of steps >= 1, or -1 for never", lambda v: v == -1 or v >= 1,
                            lambda v: "-1")
TOP_K = Constraint("must be -1 (off) or >= 0", lambda v: v >= -1, lambda v: "-1")
ABOVE_ONE = Constraint("the dual-clip constant must be > 1", lambda v: v > 1, lambda v: "3.0")
MODEL_RUNNER = Constraint("must be null (the engine's choice), v1 or v2", lambda v: v in ("v1", "v2"),
                          lambda v: "null", allow_none=True)
BETAS = Constraint("must be two floats in [0, 1)", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v),
                   lambda v: "[0.9,0.999]")


@functools.lru_cache(maxsize=None)
def field_constraints(cls: type) -> dict[str, tuple[Constraint, ...]]:
    """{field name: its constraints} of one schema dataclass (fields without any are left out)."""
    found = {}
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if typing.get_origin(hint) is typing.Annotated:
            rules = tuple(m for m in hint.__metadata__ if isinstance(m, Constraint))
            if rules:
                found[name] = rules
    return found


def violations(config: Any, prefix: str = "") -> Iterator[tuple[str, Any, Constraint]]:
    """(dotted key, value, constraint) for every value of `config` outside its field's constraint."""
    cls = type(config)
    rules = field_constraints(cls)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from violations(value, key + ".")
            continue
        for rule in rules.get(f.name, ()):
            if value is None and rule.allow_none:
                continue
            if value is None or not rule.ok(value):
                yield key, value, rule


def check_fields(config: Any, error: type[Exception] = ValueError) -> None:
    """Raise `error('<key>=<value>: <rule>; use <key>=<fix>.')` for the first value outside its constraint."""
    for key, value, rule in violations(config):
        fix = "null" if value is None else rule.fix(value)
        raise error(f"{key}={value}: {rule.rule}; use {key}={fix}.")
