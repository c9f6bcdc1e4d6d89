"""Turn a composed DictConfig into the typed dataclasses of `schema.py`, key by key.

Every failure is a `ConfigError` naming the dotted key: a missing key, an unknown key (with the
nearest existing key, found by difflib), or a value of the wrong type (with an example of the
right one). Free-form mappings (`dict[str, Any]` fields such as `override_config`) accept any child.
"""

import contextvars
import dataclasses
import functools
import types
import typing
from typing import Any, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlpost.config.errors import ConfigError, closest_key
from rlpost.config.schema import PPOTrainerConfig

# Hydra's instantiate marker, present in YAML copied from verl; it names a class and sets nothing.
TARGET = "_target_"
_EXAMPLES = {bool: "true", int: "1", float: "0.5", str: "some_name", list: "[a,b]", dict: "{}"}


def schema_keys(cls: type = PPOTrainerConfig, prefix: str = "") -> list[str]:
    """All dotted keys of a schema dataclass, parents included (children of free-form maps excluded)."""
    keys = []
    for name, hint in typing.get_type_hints(cls).items():
        key = f"{prefix}{name}"
        keys.append(key)
        if dataclasses.is_dataclass(hint):
            keys.extend(schema_keys(hint, key + "."))
    return keys


# The root schema being built: unknown keys are matched against its keys (the PPO trainer's, or e.g. SFT's).
_ROOT: contextvars.ContextVar[type] = contextvars.ContextVar("config_root", default=PPOTrainerConfig)


@functools.lru_cache(maxsize=4)
def _leaf_keys(root: type = PPOTrainerConfig) -> tuple[str, ...]:
    """The schema keys of `root` that hold values (not groups)."""
    keys = schema_keys(root)
    groups = {k.rpartition(".")[0] for k in keys}
    return tuple(k for k in keys if k not in groups)


def to_typed(cfg: DictConfig) -> PPOTrainerConfig:
    """Resolve `cfg` and build a `PPOTrainerConfig`; raise `ConfigError` naming the first bad key."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{key}: cannot resolve its value ({type(err).__name__}: {err}).") from None
    return _build(PPOTrainerConfig, data, "")


def typed_group(node: Any, cls: type, prefix: str) -> Any:
    """`node` as the typed dataclass `cls`: itself when it already is one (what the trainer hands its
    workers), else a DictConfig or mapping (a verl-style caller building a worker itself) converted once,
    every key checked and named under `prefix` (e.g. `actor_rollout_ref.`)."""
    if isinstance(node, cls):
        return node
    try:
        data = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{prefix}{getattr(err, 'full_key', '?')}: cannot resolve its value ({err}).") from None
    return _build(cls, data, prefix)


def to_typed_root(cfg: Any, cls: type) -> Any:
    """`cfg` (a DictConfig or mapping of a whole config) as the root schema `cls` other than the PPO trainer's
    (e.g. the SFT trainer's); unknown keys are matched against `cls`'s own keys."""
    token = _ROOT.set(cls)
    try:
        return typed_group(cfg, cls, "")
    finally:
        _ROOT.reset(token)


def _build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "the config root"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}={data!r}: expected a mapping of keys ({cls.__name__}); remove the value.")
    hints = typing.get_type_hints(cls)
    for name in data:
        if name not in hints and name != TARGET:
            _unknown(f"{prefix}{name}", data[name])
    values = {}
    for name, hint in hints.items():
        key = f"{prefix}{name}"
        if name not in data:
            raise ConfigError(
                f"missing key '{key}': the config must define it; compose from the default "
                f"(`defaults: [ppo_trainer, _self_]`) so that every key has its default."
            )
        values[name] = _value(hint, data[name], key)
    return cls(**values)


def _unknown(key: str, value: Any) -> None:
    # A scalar value is a leaf's: suggesting a group ('data' for 'data.foo') would be wrong advice.
    root = _ROOT.get()
    candidates = schema_keys(root) if isinstance(value, dict) else _leaf_keys(root)
    close = closest_key(key, candidates)
    hint = (f"did you mean '{close}'? use {close}={_show(value)}" if close
            else "remove it (`--cfg job` prints every key)")
    raise ConfigError(f"unknown key '{key}' (value {_show(value)}): it is not a config key; {hint}.")


def _value(hint: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key + ".")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for alt in (a for a in args if a is not type(None)):
            try:
                return _value(alt, value, key)
            except ConfigError:
                continue
        _type_error(key, value, " or ".join(_name(a) for a in args))
    if origin is list:
        if not isinstance(value, list):
            _type_error(key, value, _name(hint))
        return [_value(args[0], item, f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            _type_error(key, value, "a mapping")
        if args and dataclasses.is_dataclass(args[1]):  # {name: group}, e.g. distillation.teacher_models
            return {name: _build(args[1], item, f"{key}.{name}.") for name, item in value.items()}
        return value
    return _scalar(hint, value, key)


def _scalar(hint: type, value: Any, key: str) -> Any:
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and not isinstance(value, bool):
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:  # YAML 1.1 reads `1e-6` (no dot) as a string
                return float(value)
            except ValueError:
                pass
    if hint is str and isinstance(value, str):
        return value
    _type_error(key, value, _name(hint))


def _type_error(key: str, value: Any, expected: str) -> None:
    first = expected.split(" or ")[0].split("[")[0]
    example = _EXAMPLES.get({"bool": bool, "int": int, "float": float, "str": str, "list": list}.get(first), "null")
    raise ConfigError(f"{key}={_show(value)}: expected {expected}; e.g. {key}={example}.")


def _name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) is list:
        return f"list[{_name(typing.get_args(hint)[0])}]"
    return getattr(hint, "__name__", str(hint))


def _show(value: Any) -> str:
    return "null" if value is None else repr(value)
