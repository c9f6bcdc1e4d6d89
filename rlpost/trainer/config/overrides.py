"""Command-line overrides checked before Hydra sees them, so a typo gets rlpost's one-line message.

Hydra answers `actor.clip_ratoi=0.3` with "Key 'clip_ratoi' is not in struct" and advises `+key`, which
would only add a key nothing reads. An override of a key the default config does not have (and that
is not inside a free-form mapping such as `engine_kwargs.vllm`) is reported here with the nearest key.
"""

from __future__ import annotations


from omegaconf import DictConfig, OmegaConf

from rlpost.trainer.config.defaults import package_defaults
from rlpost.trainer.config.errors import ConfigError, closest_key, warn


def check_override_keys(overrides: list[str]) -> None:
    """Raise `ConfigError` for the first `key=value` whose key is not in the default config.

    Overrides with a `+`/`++`/`~` prefix, Hydra's own (`hydra.*`), group selections and keys under a
    free-form mapping are left to Hydra, as is every override when a user config (`--config-name`) is used.
    """
    if any(a.startswith(("--config-name", "-cn", "--config-path", "-cp")) for a in overrides):
        return  # a user YAML may define keys of its own: Hydra and the typed check judge those
    defaults = package_defaults()
    for arg in overrides:
        if "=" not in arg or arg.startswith(("+", "~", "-", "hydra.", "hydra/")):
            continue
        key = arg.split("=", 1)[0].strip()
        if _known(defaults, key):
            continue
        value = arg.split("=", 1)[1]
        # a scalar or list value is a leaf's: suggesting a group ('reward_model.model' for 'model_path') is wrong
        close = closest_key(key, _all_keys(defaults, groups=value.lstrip().startswith("{")))
        hint = (f"did you mean '{close}'? use {close}={value}" if close
                else "check the spelling against `--cfg job`")
        raise ConfigError(f"unknown key '{key}' (command line: {arg}): it is not a config key; {hint}.")


def plus_on_existing_keys(overrides: list[str]) -> list[str]:
    """`overrides` with each `+key=value` whose key the default config already has turned into `key=value`
    (a notice says so). Scripts written for a verl version that lacked the key add it with `+`; Hydra refuses
    to add a key that exists ("Could not append"). Left as they are with a user config (`--config-name`),
    whose keys are Hydra's to judge."""
    if any(a.startswith(("--config-name", "-cn", "--config-path", "-cp")) for a in overrides):
        return list(overrides)
    defaults, out = package_defaults(), []
    for arg in overrides:
        key = arg[1:].split("=", 1)[0].strip() if arg.startswith("+") and not arg.startswith("++") else None
        if key and "=" in arg and _has_key(defaults, key):
            warn(f"{arg}: rlpost has the key {key}, so the '+' (add a key) is dropped: {arg[1:]}")
            arg = arg[1:]
        out.append(arg)
    return out


def _has_key(defaults: DictConfig, key: str) -> bool:
    """`key` is in the default config itself (not only allowed under a free-form mapping)."""
    node: object = defaults
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return True


def _known(defaults: DictConfig, key: str) -> bool:
    node: object = defaults
    for part in key.split("."):
        if not isinstance(node, DictConfig):
            return False
        if part not in node:
            return _free_form(node)
        node = node._get_node(part)  # unresolved: interpolations are fine here
        if OmegaConf.is_config(node) and not isinstance(node, DictConfig):
            return True  # a list: index overrides are Hydra's business
    return True


def _free_form(node: DictConfig) -> bool:
    """True for an (initially) empty mapping or a mapping documented as free-form (engine kwargs)."""
    return len(node) == 0 or node._key() in {"vllm", "sglang", "override_config", "reward_kwargs", "engine_kwargs",
                                               "tool_config", "global_tool_config", "apply_chat_template_kwargs"}


def _all_keys(node: DictConfig, prefix: str = "", groups: bool = True) -> list[str]:
    """Every dotted key under `node`; the groups' own keys too unless `groups` is false."""
    keys = []
    for name in node:
        key = f"{prefix}{name}"
        child = node._get_node(name)
        if groups or not isinstance(child, DictConfig) or _free_form(child):
            keys.append(key)
        if isinstance(child, DictConfig):
            keys.extend(_all_keys(child, key + ".", groups))
    return keys


def _yaml_file(name: str) -> str:
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


def resolve_config_path(argv: list[str], entry_dir: str, default_name: str = "ppo_trainer") -> list[str]:
    """`argv` with a relative `--config-path` made absolute where the YAML is.

    Hydra resolves a relative `--config-path` against the entry module's folder (so verl's scripts'
    `--config-path=config` finds the packaged config); a folder beside the working directory is what a user
    of their own YAML means. The entry module's folder is searched first, as Hydra does, then the working
    directory.

    Raises:
        ConfigError: the YAML is in neither place (both are named).
    """
    import os

    for i, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag not in ("--config-path", "-cp"):
            continue
        if not value and i + 1 < len(argv):  # `--config-path DIR`: the value is the next word
            flag, value, rest = arg, argv[i + 1], argv[i + 2:]
        else:
            rest = argv[i + 1:]
        if not value or os.path.isabs(os.path.expanduser(value)) or value.startswith("pkg://"):
            return argv
        name = _yaml_file(_options(argv).get("--config-name") or _options(argv).get("-cn") or default_name)
        places = [os.path.normpath(os.path.join(entry_dir, value)), os.path.abspath(value)]
        found = next((p for p in places if os.path.isfile(os.path.join(p, name))), None)
        if found is None:
            raise ConfigError(f"--config-path={value}: no {name} in {places[0]} (beside the entry module, where "
                              f"Hydra looks) nor in {places[1]} (the working directory); give the folder that holds "
                              f"{name}, e.g. an absolute --config-path")
        return argv[:i] + [f"--config-path={found}"] + rest
    return argv


def check_user_yaml(argv: list[str]) -> None:
    """Raise `ConfigError` naming the file and line when the user's `--config-name` YAML does not parse, or the
    file when it has no defaults list (rlpost's keys then are not in it)."""
    import os

    import yaml

    opts = _options(argv)
    name, folder = opts.get("--config-name") or opts.get("-cn"), opts.get("--config-path") or opts.get("-cp")
    if not name or not folder:
        return
    path = os.path.join(folder, _yaml_file(name))
    if not os.path.isfile(path):
        raise ConfigError(f"--config-name={name}: no file {path}; put your YAML in --config-path={folder}.")
    try:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}:{where}: YAML syntax error: {problem}; fix the file (indentation, a missing "
                          "':' or an unclosed quote/bracket).") from None
    if isinstance(loaded, dict) and "defaults" not in loaded:  # else Hydra advises `+key` for every key in it
        raise ConfigError(f"{path} has no defaults list, so none of rlpost's keys is in it; add `defaults: "
                          "[ppo_trainer, _self_]` at its top (your keys then override the packaged ones).")


def _options(argv: list[str]) -> dict[str, str]:
    out, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(("--config-name", "--config-path", "-cn", "-cp")):
            if "=" in arg:
                key, value = arg.split("=", 1)
            elif i + 1 < len(argv):
                key, value = arg, argv[i + 1]
                i += 1
            else:
                key, value = arg, ""
            out[key] = value
        i += 1
    return out
