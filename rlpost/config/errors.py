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


def closest_key(key: str, candidates: "list[str] | tuple[str, ...]") -> "str | None":
    """The known key `key` was most likely meant to be, or None.

    A sibling (same parent) with a similar last part wins (`data.train_bach_size` -> `data.train_batch_size`);
    otherwise only a very similar full key (a misspelt group). Comparing full keys alone would suggest any
    key under the same parent, the shared prefix making them look alike.
    """
    import difflib

    parent, _, leaf = key.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if close:
        return siblings[close[0]]
    # the siblings were not close: another parent's key only (the shared prefix would make any sibling look alike)
    others = [c for c in candidates if c.rpartition(".")[0] != parent]
    close = difflib.get_close_matches(key, others, n=1, cutoff=0.85)
    return close[0] if close else None
