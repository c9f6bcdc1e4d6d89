"""Reading the list-of-entries YAML files (tools, interactions, agent loops) and importing the classes
they name, with one error shape: the file, the entry index and the problem."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


class ConfigEntryError(ValueError):
    """A YAML entry cannot be used; the message names the file, `<key>[<index>]` and the reason."""


def entry_error(
    path: str | Path, key: str, index: int | None, problem: str, target: str | None = None
) -> ConfigEntryError:
    """The error for entry `key[index]` of `path` (index None: the file as a whole)."""
    where = key if index is None else f"{key}[{index}]"
    named = f" ({target})" if target else ""
    return ConfigEntryError(f"{path}: {where}{named}: {problem}")


def load_entries(path: str | Path, key: str | None) -> list[dict[str, Any]]:
    """The list under `key` of YAML file `path` (key None: the file is the list), as plain dicts with
    interpolations resolved.

    Raises:
        ConfigEntryError: missing file, bad YAML, no such key, not a list, or an entry that is not a mapping.
    """
    from omegaconf import OmegaConf

    path = Path(path)
    if not path.is_file():
        raise entry_error(path, key or "file", None, "file not found")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:  # omegaconf/yaml raise several types for unreadable files
        raise entry_error(path, key or "file", None, f"cannot read YAML: {e}") from e
    entries = data if key is None else (data.get(key) if isinstance(data, dict) else None)
    label = key or "file"
    if not isinstance(entries, list):
        raise entry_error(path, label, None, f"expected a list under {label!r}, got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise entry_error(path, label, i, f"each entry must be a mapping, got {entry!r}")
    return entries


def import_class(dotted: str) -> type:
    """The class (or any attribute) at `package.module.Name`.

    Raises:
        ImportError: not a dotted path, the module does not import, or it has no such attribute.
    """
    if not isinstance(dotted, str) or "." not in dotted:
        raise ImportError(f"expected 'package.module.ClassName', got {dotted!r}")
    module_name, name = dotted.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"cannot import module {module_name!r}: {e}") from e
    if not hasattr(module, name):
        raise ImportError(f"module {module_name!r} has no attribute {name!r}")
    return getattr(module, name)
