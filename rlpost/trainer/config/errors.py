"""The one exception and the one warning class of config checking."""

import warnings


class ConfigError(ValueError):
    """A bad config value or combination. The message names the key(s), the value(s), the rule and a
    valid value to use; `main_ppo` prints it as `config error: <message>` and exits with status 2."""


class ConfigWarning(UserWarning):
    """A deprecated key that was mapped onto its new name, or a legal but suspicious combination."""


def warn(message: str) -> None:
    """Emit a `ConfigWarning` pointing at the caller of the config check."""
    warnings.warn(message, ConfigWarning, stacklevel=3)
