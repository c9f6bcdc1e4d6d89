"""`python -m rlpost.trainer.main_ppo [key=value ...]`: compose, validate, then dry-run or train.

    python -m rlpost.trainer.main_ppo trainer.dry_run=true          # print the plan, start nothing
    python -m rlpost.trainer.main_ppo --cfg job                     # print the composed config
    python -m rlpost.trainer.main_ppo --config-path=/abs/dir --config-name=my_exp key=value

A user YAML in any folder extends the default with `defaults: [ppo_trainer, _self_]`: this module
puts the package's config folder on Hydra's search path itself, so no plugin or flag is needed. A relative
`--config-path` is looked for beside this module first (Hydra's rule: verl's `--config-path=config` is the
packaged config), then beside the working directory.
"""

import atexit
import os
import sys
import threading
import warnings

import hydra
from omegaconf import DictConfig

from rlpost.trainer.config import ConfigError, ConfigWarning, typed_config
from rlpost.trainer.config.overrides import (check_override_keys, check_user_yaml, plus_on_existing_keys,
                                             resolve_config_path)
from rlpost.trainer.config.memory import check_dry_run_memory
from rlpost.trainer.config.plan import dry_run_plan
from rlpost.data.loader import create_rl_sampler  # noqa: F401  verl's names in this module
from rlpost.data.rl_dataset import create_rl_dataset  # noqa: F401
from rlpost.trainer.ppo.launch import TaskRunner, run_ppo  # noqa: F401

SEARCH_PATH = "pkg://rlpost.trainer.config"


# Hydra's command-line flags that take the next word as their value (`--cfg job`, `-cn my_config`, ...).
_VALUE_FLAGS = frozenset({"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-c", "--cfg",
                          "-p", "--package", "--experimental-rerun", "-sc", "--shell-completion"})
_INFO_VALUES = frozenset({"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"})


def _first_override(argv: list[str]) -> int:
    """Index in `argv` of the first override (a word that is neither a flag nor a flag's value), or len(argv)."""
    i = 1
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            return i
        takes_value = "=" not in word and (word in _VALUE_FLAGS or (
            word in ("-i", "--info") and i + 1 < len(argv) and argv[i + 1] in _INFO_VALUES))
        i += 2 if takes_value else 1
    return len(argv)


def with_search_path(argv: list[str]) -> list[str]:
    """`argv` plus `hydra.searchpath=[pkg://rlpost.trainer.config]` (merged into a user's own list), placed
    beside the user's overrides: Hydra's parser takes the overrides as one run of words, so one added after a
    trailing flag (`... trainer.dry_run=true --cfg job`) would be refused."""
    for i, arg in enumerate(argv):
        if arg.startswith("hydra.searchpath="):
            if SEARCH_PATH in arg:
                return argv
            inner = arg.split("=", 1)[1].strip().strip("[]").strip()
            paths = f"{inner},{SEARCH_PATH}" if inner else SEARCH_PATH
            return argv[:i] + [f"hydra.searchpath=[{paths}]"] + argv[i + 1:]
    at = _first_override(argv)
    return argv[:at] + [f"hydra.searchpath=[{SEARCH_PATH}]"] + argv[at:]


def run(cfg: DictConfig) -> int:
    """Validate `cfg` (the run's one conversion to the typed config); print the dry-run plan or hand the typed
    config to `run_ppo`. Returns the exit status."""
    try:
        typed = typed_config(cfg)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    if typed.trainer.dry_run:
        print(dry_run_plan(typed))
        try:
            check_dry_run_memory(typed)
        except ConfigError as err:
            print(f"config error: {err}", file=sys.stderr)
            return 2
        from rlpost.trainer.ppo.preflight import dry_run_model_notes

        try:
            for note in dry_run_model_notes(typed):
                print(f"dry run: {note}", file=sys.stderr)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    from rlpost.reward import RewardFunctionError
    from rlpost.trainer.ppo.launch import InputError
    from rlpost.trainer.ppo.interrupt import RunInterrupted
    from rlpost.trainer.ppo.nonfinite import NonFiniteError
    from rlpost.checkpoint.manager import CheckpointError

    try:
        run_ppo(typed)
    except (InputError, CheckpointError, RewardFunctionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except NonFiniteError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except RunInterrupted as err:
        print(f"[rlpost] {err}", file=sys.stderr)
        return err.exit_status
    return 0


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    status = run(cfg)
    if status:
        sys.exit(status)  # SystemExit passes through Hydra's error reporting untouched


def main() -> None:
    """Console entry point."""
    sys.argv = with_search_path(sys.argv)
    _plain_config_warnings()
    try:
        sys.argv = sys.argv[:1] + resolve_config_path(sys.argv[1:], os.path.dirname(os.path.abspath(__file__)))
        check_user_yaml(sys.argv[1:])
        sys.argv = sys.argv[:1] + plus_on_existing_keys(sys.argv[1:])
        check_override_keys(sys.argv[1:])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


def _plain_config_warnings() -> None:
    """Print ConfigWarnings as one line (`config warning: ...`) instead of file:line + source."""
    default = warnings.formatwarning

    def _format(message, category, *args, **kwargs):
        if issubclass(category, ConfigWarning):
            return f"config warning: {message}\n"
        return default(message, category, *args, **kwargs)

    warnings.formatwarning = _format


def _exit_after_run() -> None:
    """End the process once a run has finished: exit handlers run (Ray's, logging's) and output is flushed,
    but the interpreter's teardown of every loaded module (torch, transformers, ray: seconds) is skipped.
    With a non-daemon thread still running (a user's pool, an uploader), Python's own exit is kept: it waits
    for such threads."""
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _exit_after_run()  # errors leave main() by SystemExit (status 2 or 3) or a traceback, and exit as usual
