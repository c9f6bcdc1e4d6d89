"""verl's current trainer key set (`tests/data/verl_generated_ppo_trainer_keys.txt`, written by
`scripts/verl_key_list.py` from verl's `_generated_ppo_trainer.yaml`): every key is in rlpost's composed config,
so a verl script can set it without `+`, and each is built (a typed field the code reads), accepted with a
notice, or refused by name. None is unknown."""

from pathlib import Path

from omegaconf import OmegaConf

from rlpost.trainer.config.convert import schema_keys
from rlpost.trainer.config.unsupported import NOT_SUPPORTED_YET, NOTICES, UNBUILT_GROUPS

KEY_FILE = Path(__file__).parents[2] / "data" / "verl_generated_ppo_trainer_keys.txt"
VERL_KEYS = [line for line in KEY_FILE.read_text().splitlines() if line]


def _flat(data, prefix=""):
    out = set()
    for key, value in data.items():
        out.add(prefix + key)
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
    return out


def _within(key: str, groups) -> bool:
    return any(key == g or key.startswith(g + ".") for g in groups)


def classify(key: str, typed: set[str]) -> str | None:
    """refused / notice / built, or None for a key rlpost would not know what to do with."""
    if key in NOT_SUPPORTED_YET or _within(key, UNBUILT_GROUPS):
        return "refused"
    if _within(key, NOTICES):
        return "notice"
    parts = key.split(".")
    if any(".".join(parts[:i]) in typed for i in range(1, len(parts) + 1)):
        return "built"  # the key itself, or an entry of a free-form mapping field (tool_config, engine_kwargs)
    return None


def test_the_key_list_is_verls_generated_yaml():
    assert len(VERL_KEYS) == 507 and VERL_KEYS == sorted(set(VERL_KEYS))
    assert "global_profiler.global_tool_config.torch_memory.stack_depth" in VERL_KEYS
    assert not any(k.endswith("._target_") for k in VERL_KEYS)


def test_every_verl_key_composes_and_is_built_noticed_or_refused(default_cfg):
    present = _flat(OmegaConf.to_container(default_cfg, resolve=False))
    assert [k for k in VERL_KEYS if k not in present] == []
    typed = set(schema_keys())
    kinds = {k: classify(k, typed) for k in VERL_KEYS}
    assert [k for k, kind in kinds.items() if kind is None] == []
    counts = {kind: sum(1 for v in kinds.values() if v == kind) for kind in ("built", "notice", "refused")}
    assert counts["built"] > 300 and counts["refused"] > 20 and counts["notice"] > 10, counts


def test_verl_spellings_reach_the_keys_rlpost_reads(small_cfg):
    from rlpost.trainer.config import typed_config, validate_config

    arr = "actor_rollout_ref"
    cfg = validate_config(small_cfg({"reward_manager.name": "dapo",
                                     f"{arr}.actor.profiler.tool_config.torch.discrete": True,
                                     f"{arr}.actor.rollout_n": 4,
                                     "critic.profiler.tool_config.torch_memory.trace_alloc_max_entries": 500}))
    typed = typed_config(cfg)
    assert typed.reward_model.reward_manager == "dapo" and typed.actor_rollout_ref.actor.profiler.discrete is True
    assert typed.global_profiler.global_tool_config["torch_memory"]["trace_alloc_max_entries"] == 500
    assert typed.actor_rollout_ref.ref.rollout_n == 4 == typed.actor_rollout_ref.rollout.n


def test_verl_keys_of_unbuilt_features_are_refused_by_name(small_cfg):
    import pytest

    from rlpost.trainer.config import ConfigError, validate_config

    arr = "actor_rollout_ref"
    for key, value in ((f"{arr}.rollout.mtp", {"enable": True}),
                       ("global_profiler.global_tool_config.torch_memory.stacks", "python"),
                       (f"{arr}.ref.profiler.tool_config.npu.level", "level1"),
                       ("reward_model.reward_loop_class_name", "MyLoop")):
        with pytest.raises(ConfigError, match="not supported yet") as err:
            validate_config(small_cfg({key: value}))
        assert key.rsplit(".", 1)[-1] in str(err.value), (key, str(err.value))
