"""The config exception and warning (`rlpost.config.errors`), where the trainer's config checks import them."""

from rlpost.config.errors import ConfigError, ConfigWarning, closest_key, warn

__all__ = ["ConfigError", "ConfigWarning", "closest_key", "warn"]
