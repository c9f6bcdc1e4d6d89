"""The command line of a verl recipe entry point: its arguments translated into `main_ppo`'s, then one run."""

from __future__ import annotations

import sys
from typing import Callable

from rlpost.trainer.config.errors import ConfigError


def run_translated(translate: Callable[[list[str]], list[str]]) -> None:
    """Replace `sys.argv`'s arguments by `translate(arguments)` and run `main_ppo`; a `ConfigError` from the
    translation prints one line and exits with status 2 (as main_ppo's own config errors do)."""
    from rlpost.trainer import main_ppo

    try:
        sys.argv = sys.argv[:1] + translate(sys.argv[1:])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    main_ppo.main()
