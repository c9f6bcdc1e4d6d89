"""DictConfig -> typed dataclasses (`rlpost.config.convert`), where the trainer's config code imports it."""

from rlpost.config.convert import TARGET, schema_keys, to_typed, typed_group

__all__ = ["TARGET", "schema_keys", "to_typed", "typed_group"]
