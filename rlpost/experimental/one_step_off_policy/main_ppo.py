"""verl's one-step-off-policy entry point: the same command line, run as rlpost's split placement one step off.

    python -m rlpost.experimental.one_step_off_policy.main_ppo [ppo_trainer overrides] \\
        rollout.nnodes=1 rollout.n_gpus_per_node=1

verl's recipe config is ppo_trainer plus a top-level `rollout.{nnodes,n_gpus_per_node}` group (the rollout
devices) and its own defaults: `actor_rollout_ref.hybrid_engine=false`, `rollout.free_cache_engine=false`,
`rollout.calculate_log_probs=true`, `algorithm.rollout_correction.bypass_mode=true`; rlpost adds
`trainer.staleness=1`. A default is applied only where the command line does not set that key;
`actor_rollout_ref.hybrid_engine=true` (verl's colocated scripts) runs the hybrid engine on-policy.
"""

from __future__ import annotations


from rlpost.experimental.recipe_cli import run_translated
from rlpost.trainer.config.errors import ConfigError

ARR = "actor_rollout_ref"
CONFIG_NAMES = ("one_step_off_ppo_trainer", "one_step_off_ppo_trainer.yaml")
ROLLOUT_KEYS = {"nnodes": f"{ARR}.rollout.nnodes", "n_gpus_per_node": f"{ARR}.rollout.n_gpus_per_node"}
RECIPE_DEFAULTS = {f"{ARR}.hybrid_engine": "false", f"{ARR}.rollout.free_cache_engine": "false",
                   f"{ARR}.rollout.calculate_log_probs": "true", "algorithm.rollout_correction.bypass_mode": "true"}


def translate(args: list[str]) -> list[str]:
    """This recipe's command line (verl's) as a main_ppo command line."""
    kept, given = [], {}
    for arg in args:
        if arg.startswith("--config-name") and arg.split("=", 1)[-1] in CONFIG_NAMES:
            continue  # the recipe's config is ppo_trainer plus the defaults below
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key.startswith("rollout."):
            name = key.removeprefix("rollout.")
            if name not in ROLLOUT_KEYS:
                raise ConfigError(f"rollout.{name}: not a key of verl's one-step-off rollout group; keys: "
                                  f"{', '.join(ROLLOUT_KEYS)} (or set {ARR}.rollout.{name}).")
            arg, key = f"{ROLLOUT_KEYS[name]}={value}", ROLLOUT_KEYS[name]
        if sep:
            given[key] = value
        kept.append(arg)
    extra = [f"{k}={v}" for k, v in RECIPE_DEFAULTS.items() if k not in given]
    split = given.get(f"{ARR}.hybrid_engine", "false").lower() == "false"
    if split and "trainer.staleness" not in given:
        extra.append("trainer.staleness=1")
    return kept + extra


def main() -> None:
    """Console entry point."""
    run_translated(translate)


if __name__ == "__main__":
    from rlpost.trainer.main_ppo import _exit_after_run

    main()
    _exit_after_run()
