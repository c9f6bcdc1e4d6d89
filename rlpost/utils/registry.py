"""One name -> object registry class, used for every pluggable choice in rlpost.

Advantage estimators, policy losses, rollout engines, reward managers, ... are all looked up by the
name a config gives, through this single class, so every "unknown name" error reads the same way.
"""

from __future__ import annotations

import difflib
from enum import Enum
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def _as_name(name: str | Enum) -> str:
    """Turns a str-valued enum member (e.g. `AdvantageEstimator.GRPO`) into its plain string value."""
    return name.value if isinstance(name, Enum) else name


class Registry:
    """Maps names to objects of one kind.

    Example:
        >>> LOSSES = Registry("policy loss")
        >>> @LOSSES.register("vanilla")
        ... def vanilla(x): return x
        >>> LOSSES.get("vanilla") is vanilla
        True

    Args:
        kind: What the registry holds, used in error messages (e.g. "advantage estimator").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str | Enum) -> Callable[[T], T]:
        """Returns a decorator that registers its target under `name` and returns it unchanged.

        Raises:
            ValueError: `name` is already taken by a different object.
        """
        key = _as_name(name)
        if not isinstance(key, str) or not key:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            existing = self._entries.get(key)
            if existing is not None and existing is not obj:
                raise ValueError(f"{self.kind} {key!r} is already registered (to {existing!r})")
            self._entries[key] = obj
            return obj

        return decorator

    def get(self, name: str | Enum) -> Any:
        """Returns the object registered under `name`.

        Raises:
            ValueError: unknown name; the message lists the valid names and the nearest one.
        """
        key = _as_name(name)
        if key in self._entries:
            return self._entries[key]
        valid = self.names()
        close = difflib.get_close_matches(str(key), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown {self.kind} {key!r}. Valid names: {valid}.{hint}")

    def mapping(self) -> dict[str, Any]:
        """The live name -> object dict: verl keeps its registries as module-level dicts that code reads
        and writes directly, and this is the same object, so such writes register here too."""
        return self._entries

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, (str, Enum)) and _as_name(name) in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
