"""Build interactions from an interaction YAML (verl's format), failing with one message that names
the entry.

    interaction:
      - name: gsm8k                      # what samples put in extra_info.interaction_kwargs.name
        class_name: rlpost.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}

Without `name`, the class name in lower case, less an `Interaction` suffix, is used (as verl).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpost.interactions.base import BaseInteraction
from rlpost.tools.utils.yaml_entries import entry_error, import_class, load_entries


def get_interaction_class(class_name: str) -> type:
    """The class at dotted path `class_name` (verl's name for this helper)."""
    return import_class(class_name)


def default_interaction_name(class_name: str) -> str:
    """`pkg.Gsm8kInteraction` -> `gsm8k`; `pkg.Judge` -> `judge`."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") and simple != "Interaction"
            else simple).lower()


def _build_interaction(path: str | Path, index: int, entry: dict[str, Any]) -> BaseInteraction:
    class_name = entry.get("class_name")
    if not isinstance(class_name, str):
        raise entry_error(path, "interaction", index, "missing 'class_name' (a dotted path)")
    target = f"class_name {class_name!r}"
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise entry_error(path, "interaction", index, f"'config' must be a mapping, got {config!r}", target)
    try:
        cls = get_interaction_class(class_name)
    except ImportError as e:
        raise entry_error(path, "interaction", index, f"unknown interaction class: {e}", target) from e
    if not (isinstance(cls, type) and issubclass(cls, BaseInteraction)):
        raise entry_error(path, "interaction", index,
                          "the class must subclass rlpost.interactions.base.BaseInteraction", target)
    name = entry.get("name") or default_interaction_name(class_name)
    try:
        return cls(config={**config, "name": name})
    except Exception as e:  # the user's constructor: report which entry broke, keep the cause
        raise entry_error(path, "interaction", index, f"constructing it failed: {type(e).__name__}: {e}",
                          target) from e


def initialize_interactions_from_config(interaction_config_file: str | Path) -> dict[str, BaseInteraction]:
    """{name: interaction} for every entry of the YAML.

    Raises:
        ConfigEntryError: unreadable file, unknown class, failing constructor or a duplicate name; the
            message names the entry.
    """
    interactions: dict[str, BaseInteraction] = {}
    for index, entry in enumerate(load_entries(interaction_config_file, "interaction")):
        interaction = _build_interaction(interaction_config_file, index, entry)
        if interaction.name in interactions:
            raise entry_error(interaction_config_file, "interaction", index,
                              f"duplicate interaction name {interaction.name!r}")
        interactions[interaction.name] = interaction
    return interactions


def interactions_by_name(interaction_config_file: str | Path | None) -> dict[str, BaseInteraction]:
    """Like `initialize_interactions_from_config`, {} when no file is configured."""
    return initialize_interactions_from_config(interaction_config_file) if interaction_config_file else {}
