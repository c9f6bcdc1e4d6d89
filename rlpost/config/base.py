"""`BaseConfig`: the read-only, dict-style view shared by every typed config class.

The typed configs are frozen dataclasses: a validated key is never rewritten in place (a number
derived from config, such as rows per rank, gets its own name where it is computed). verl code reads
configs as mappings, so each class also answers `get`, `[]`, `in`, `keys()` and `items()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any


class BaseConfig:
    """Mixin for the frozen config dataclasses: mapping-style reads over the dataclass fields."""

    def get(self, key: str, default: Any = None) -> Any:
        """The field `key`, or `default` when the class has no such field (as `dict.get`)."""
        if key in self.__dataclass_fields__:
            return getattr(self, key)
        return default

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(f"{type(self).__name__} has no key {key!r}; keys: {sorted(self.__dataclass_fields__)}")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.__dataclass_fields__

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dataclass_fields__)

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)

    def keys(self) -> list[str]:
        """Field names, in declaration order."""
        return list(self.__dataclass_fields__)

    def items(self) -> list[tuple[str, Any]]:
        """(field name, value) pairs."""
        return [(k, getattr(self, k)) for k in self.__dataclass_fields__]

    def values(self) -> list[Any]:
        """Field values."""
        return [getattr(self, k) for k in self.__dataclass_fields__]

    def select(self, dotted: str, default: Any = None) -> Any:
        """Value of a dotted key below this node (`actor.optim.lr`), or `default` if a part is missing."""
        node: Any = self
        for part in dotted.split("."):
            if isinstance(node, BaseConfig) or isinstance(node, dict):
                if part not in node:
                    return default
                node = node[part]
            else:
                return default
        return node

    def replace(self, **changes: Any) -> Any:
        """A copy with dotted keys below this node changed, e.g. `cfg.replace(**{"rollout.n": 4})`: the config
        itself is never rewritten, so code that needs another value builds another config."""
        direct: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for dotted, value in changes.items():
            head, _, rest = dotted.partition(".")
            if head not in self.__dataclass_fields__:
                raise KeyError(f"{type(self).__name__} has no key {head!r}; keys: {sorted(self.__dataclass_fields__)}")
            if rest:
                nested.setdefault(head, {})[rest] = value
            else:
                direct[head] = value
        for head, inner in nested.items():
            direct[head] = getattr(self, head).replace(**inner)
        return dataclasses.replace(self, **direct)

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict (lists and free-form maps copied)."""
        return to_plain(self)


def to_plain(value: Any) -> Any:
    """Typed config (or any nesting of them, dicts and lists) as plain Python containers."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value
