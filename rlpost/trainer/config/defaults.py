"""The packaged YAML defaults (`rlpost.config.defaults`), under the name the trainer's config code imports."""

from rlpost.config.defaults import CONFIG_DIR, default_of, package_defaults

__all__ = ["CONFIG_DIR", "default_of", "package_defaults"]
