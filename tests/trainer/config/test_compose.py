"""The composed default: every spec key is present, overridable without `+`, with the seeds' default."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlpost.trainer.config import CONFIG_DIR
from rlpost.trainer.config.convert import schema_keys

SPEC_KEYS = [line.strip() for line in (Path(__file__).parents[2] / "data" / "ppo_trainer_keys.txt").read_text().splitlines()
             if line.strip()]


def flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        out[prefix + key] = value
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
    return out


def override_for(value):
    """A command-line override string different from `value`, and the value it should compose to."""
    if isinstance(value, bool):
        return str(not value).lower(), not value
    if isinstance(value, int):
        return str(value + 3), value + 3
    if isinstance(value, float):
        return str(value + 0.25), value + 0.25
    if isinstance(value, list):
        return "[model,extra]", ["model", "extra"]
    if isinstance(value, dict):
        return "{}", None
    return "some_value", "some_value"


def test_all_spec_keys_present(default_cfg):
    flat = flatten(OmegaConf.to_container(default_cfg, resolve=True))
    assert len(SPEC_KEYS) == 234
    assert [k for k in SPEC_KEYS if k not in flat] == []


def test_schema_matches_yaml(default_cfg):
    # The dataclasses hold the types and the YAML the defaults: their key sets must be the same.
    flat = flatten(OmegaConf.to_container(default_cfg, resolve=True))
    free = ("override_config.", "engine_kwargs.vllm.", "engine_kwargs.sglang.", "reward_kwargs.",
            "nsight_options.", "tool_config.")
    from rlpost.trainer.config.unsupported import UNBUILT_GROUPS  # typed as one mapping each

    teachers = "distillation.teacher_models."  # {name: TeacherModelConfig}: its default entry is checked below
    yaml_keys = {k for k in flat if not any(f in k for f in free) and not k.startswith(teachers)
                 and not any(k.startswith(group + ".") for group in UNBUILT_GROUPS)}
    assert yaml_keys == set(schema_keys())
    from rlpost.config.schema_distillation import TeacherModelConfig

    default = teachers + "teacher_model."
    entry = {k.removeprefix(default).split(".")[0] for k in flat if k.startswith(default)}
    assert entry == set(TeacherModelConfig.__dataclass_fields__)


@pytest.mark.timeout(120)
def test_every_spec_key_overridable_without_plus(default_cfg, compose_fn):
    flat = flatten(OmegaConf.to_container(default_cfg, resolve=True))
    leaves = [k for k in SPEC_KEYS if not any(other.startswith(k + ".") for other in SPEC_KEYS)]
    overrides, expected = [], {}
    for key in leaves:
        text, value = override_for(flat[key])
        overrides.append(f"{key}={text}")
        expected[key] = value
    cfg = compose_fn(overrides=tuple(overrides))  # one real Hydra compose, 200+ CLI overrides
    for key, value in expected.items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == (value if value is not None else {} if isinstance(flat[key], dict) else value), key


def test_parent_keys_overridable_without_plus(compose_fn):
    cfg = compose_fn(overrides=(
        "actor_rollout_ref.rollout.multi_turn=true",
        "reward_model.model={path: /rm}",
        "actor_rollout_ref.rollout.engine_kwargs.sglang={attention_backend: triton}",
        "actor_rollout_ref.model.override_config={}",
    ))
    assert cfg.actor_rollout_ref.rollout.multi_turn is True
    assert cfg.reward_model.model.path == "/rm" and cfg.reward_model.model.use_shm is False
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend == "triton"


@pytest.mark.parametrize("key, value", [
    ("data.max_prompt_length", 512), ("data.train_batch_size", 1024), ("data.truncation", "error"),
    ("data.image_key", "images"), ("actor_rollout_ref.hybrid_engine", True),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 256), ("actor_rollout_ref.actor.ppo_micro_batch_size", None),
    ("actor_rollout_ref.actor.clip_ratio", 0.2), ("actor_rollout_ref.actor.optim.lr", 1e-6),
    ("actor_rollout_ref.actor.optim.warmup_style", "constant"), ("actor_rollout_ref.actor.strategy", "fsdp2"),
    ("actor_rollout_ref.actor.checkpoint.contents", ["model", "optimizer", "extra"]),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 16), ("actor_rollout_ref.rollout.name", "vllm"),
    ("actor_rollout_ref.rollout.top_k", -1), ("actor_rollout_ref.rollout.gpu_memory_utilization", 0.5),
    ("actor_rollout_ref.rollout.load_format", "dummy_dtensor"), ("actor_rollout_ref.rollout.val_kwargs.temperature", 0),
    ("critic.optim.lr", 1e-5), ("reward_model.reward_manager", "naive"), ("reward_model.enable", False),
    ("custom_reward_function.name", "compute_score"), ("algorithm.adv_estimator", "gae"),
    ("algorithm.kl_ctrl.kl_coef", 0.001), ("algorithm.kl_ctrl.horizon", 10000), ("trainer.total_epochs", 30),
    ("trainer.logger", ["console", "wandb"]), ("trainer.resume_mode", "auto"), ("trainer.device", "cuda"),
    ("trainer.ray_wait_register_center_timeout", 300), ("trainer.dry_run", False), ("ray_init.num_cpus", None),
])
def test_seed_defaults(default_cfg, key, value):
    assert OmegaConf.select(default_cfg, key) == value


def test_interpolations_follow_their_source(compose_fn):
    cfg = compose_fn(overrides=(
        "data.max_prompt_length=77", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=999", "trainer.experiment_name=e1",
    ))
    assert cfg.actor_rollout_ref.rollout.prompt_length == 77
    assert cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 999
    assert cfg.critic.use_dynamic_bsz is True
    assert cfg.trainer.default_local_dir.endswith("/e1")


UNBUILT_MARK = "every key keeps verl's default"  # a group of verl's keys for a feature not built: one comment


def test_every_yaml_key_has_a_comment_above():
    missing = []
    for path in sorted(CONFIG_DIR.glob("**/*.yaml")):
        lines = path.read_text().splitlines()
        unbuilt_indent = None  # indentation of the unbuilt group being read, if any
        for i, line in enumerate(lines):
            if not re.match(r"^\s*[\w-]+:", line):
                continue
            indent = len(line) - len(line.lstrip())
            if unbuilt_indent is not None and indent > unbuilt_indent:
                continue  # inside an unbuilt group: its comment covers the keys
            unbuilt_indent = None
            prev = next((p for p in reversed(lines[:i]) if p.strip()), "")
            above = " ".join(p.strip().lstrip("#").strip() for p in lines[max(0, i - 3):i] if p.strip().startswith("#"))
            if UNBUILT_MARK in above:
                unbuilt_indent = indent
            if path.name == "ppo_trainer.yaml" and indent == 0:
                continue  # top-level groups of the root file
            if not prev.strip().startswith("#"):
                missing.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert missing == []


@pytest.mark.parametrize("name, keys", [
    ("evaluation", ["data.path", "data.prompt_key", "data.response_key", "data.data_source_key",
                    "data.reward_model_key", "custom_reward_function.path", "custom_reward_function.name",
                    "ray_init.num_cpus", "ray_init.timeline_json_file"]),
    ("generation", ["trainer.nnodes", "trainer.n_gpus_per_node", "trainer.device", "data.n_samples",
                    "data.output_path", "data.batch_size", "model.path", "model.external_lib", "rollout.mode",
                    "rollout.top_k", "rollout.log_prob_micro_batch_size_per_gpu", "rollout.calculate_log_probs",
                    "actor.strategy", "actor.entropy_checkpointing", "actor.fsdp_config.fsdp_size",
                    "ray_init.timeline_json_file"]),
    ("sft_trainer", ["optim.lr", "optim.weight_decay", "optim.warmup_steps_ratio", "optim.clip_grad",
                     "optim.lr_scheduler", "data.train_files", "data.micro_batch_size_per_gpu",
                     "model.partial_pretrain", "trainer.total_epochs"]),
])
def test_other_configs_compose_with_seed_keys(compose_fn, name, keys):
    flat = flatten(OmegaConf.to_container(compose_fn(name), resolve=True))
    assert [k for k in keys if k not in flat] == []
    if name == "sft_trainer":
        assert flat["optim.lr"] == 1e-5 and flat["optim.lr_scheduler"] == "cosine"
    if name == "generation":
        assert flat["rollout.top_p"] == 0.7 and flat["data.n_samples"] == 5
