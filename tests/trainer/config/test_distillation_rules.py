"""Start-up rules and dry-run plan of `distillation.*` (no Ray, no model loaded)."""

import warnings

import pytest

from rlpost.trainer.config import ConfigError, ConfigWarning, typed_config
from rlpost.trainer.config.plan import dry_run_plan

ON = {"distillation.enabled": True, "distillation.teacher_models.teacher_model.model_path": "/m/teacher"}


def test_teachers_added_with_plus_get_the_default_entrys_keys_and_the_plan_names_them(small_cfg):
    typed = typed_config(small_cfg({
        **ON, "distillation.teacher_models.teacher_model.key": "openai/gsm8k",
        "distillation.teacher_models.geo.key": "geo3k", "distillation.teacher_models.geo.model_path": "/m/geo",
        "distillation.nnodes": 1, "distillation.n_gpus_per_node": 1}))
    geo = typed.distillation.teachers()["geo"]
    assert (geo.key, geo.model_path, geo.num_replicas) == ("geo3k", "/m/geo", 0)
    assert geo.inference["name"] == typed.actor_rollout_ref.rollout.name  # follows the rollout, as the default does
    plan = dry_run_plan(typed)
    assert "teachers: FSDP forward-only on their own pool of 1 devices" in plan
    assert "teacher geo: /m/geo (rows with data_source=geo3k)" in plan
    assert "distillation: k3 reverse KL on the student's samples, coef=1.0; actor loss += coef x divergence" in plan


def test_default_is_off_and_a_teacher_beside_the_actor(small_cfg):
    assert typed_config(small_cfg()).distillation.teachers() == {}
    plan = dry_run_plan(typed_config(small_cfg(ON)))
    assert "teachers: FSDP forward-only on the trainer's devices (beside the actor)" in plan
    assert "teacher teacher_model: /m/teacher (every row)" in plan


@pytest.mark.parametrize("values, message", [
    ({"distillation.enabled": True}, "distillation.enabled=true, every distillation.teacher_models.<name>.model_path="
                                     "null: distillation needs a teacher"),
    ({**ON, "distillation.distillation_loss.loss_mode": "forward_kl_topk", "distillation.distillation_loss.topk": 0},
     "distillation.distillation_loss.topk=0 with distillation.distillation_loss.loss_mode=forward_kl_topk: a top-k "
     "mode needs k >= 1"),
    ({**ON, "distillation.distillation_loss.loss_mode": "jsd_topk",
      "distillation.distillation_loss.use_policy_gradient": True},
     "not supported yet: distillation.distillation_loss.use_policy_gradient=true with "
     "distillation.distillation_loss.loss_mode=jsd_topk"),
    ({**ON, "distillation.distillation_loss.loss_mode": "reverse_kl_topk",
      "distillation.teacher_models.b.model_path": "/m/b"},
     "not supported yet: distillation.distillation_loss.loss_mode=reverse_kl_topk with several teachers without a key"),
    ({**ON, "distillation.distillation_loss.loss_mode": "forward_kl_topk",
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2},
     "not supported yet: distillation.distillation_loss.loss_mode=forward_kl_topk with "
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"),
    ({**ON, "distillation.distillation_loss.loss_mode": "k4"}, "distillation.distillation_loss.loss_mode=k4: not a "
                                                               "distillation loss mode"),
    ({**ON, "distillation.distillation_loss.policy_loss_mode": "gspo"},
     "not supported yet: distillation.distillation_loss.policy_loss_mode=gspo"),
    ({**ON, "distillation.teacher_models.teacher_model.key": "a", "distillation.teacher_models.b.model_path": "/m/b",
      "distillation.teacher_models.b.key": "a"}, "distillation.teacher_models.*.key=a on two teachers"),
    ({**ON, "distillation.teacher_models.b.model_path": "/m/b", "distillation.teacher_models.b.key": "x"},
     "distillation.teacher_models.teacher_model.key=null beside teachers with a key"),
    ({**ON, "distillation.teacher_models.teacher_model.weight": 0.0},
     "distillation.teacher_models.teacher_model.weight=0.0: a teacher's weight in the mixture is > 0"),
    ({**ON, "distillation.nnodes": 1, "distillation.n_gpus_per_node": 0},
     "distillation.nnodes=1, distillation.n_gpus_per_node=0: the teachers' own pool needs at least one device"),
    ({**ON, "distillation.distillation_loss.distillation_loss_coef": -1.0},
     "distillation.distillation_loss.distillation_loss_coef=-1.0: a weight is >= 0"),
])
def test_bad_values_are_refused_by_name(small_cfg, values, message):
    with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace("(", r"\(")):
        typed_config(small_cfg(values))


def test_engine_settings_are_accepted_with_a_notice_and_a_path_without_enabled_warns(small_cfg):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        typed_config(small_cfg({**ON, "distillation.teacher_models.teacher_model.inference.gpu_memory_utilization": 0.4}))
        typed_config(small_cfg({"distillation.teacher_models.teacher_model.model_path": "/m/teacher"}))
    lines = [str(w.message) for w in caught]
    assert any(line.startswith("distillation.teacher_models.teacher_model.inference accepted: ") for line in lines)
    assert any("model_path is set but distillation.enabled=false" in line for line in lines)


def test_the_plan_sizes_a_teacher_from_its_config(small_cfg, tiny_model_dir):
    from rlpost.utils.memory_estimate import load_shape

    params = load_shape(tiny_model_dir).params
    plan = dry_run_plan(typed_config(small_cfg({**ON, "distillation.teacher_models.teacher_model.model_path":
                                                tiny_model_dir})))
    # the trainer's 2 devices hold the shards: 2 bytes x params / 2
    assert f"{params / 1e6:.1f}M parameters, {params / 2**30:.2f} GiB of bf16 weights per device" in plan


def test_unkeyed_teachers_are_a_weighted_mixture_in_the_plan(small_cfg):
    plan = dry_run_plan(typed_config(small_cfg({**ON, "distillation.teacher_models.b.model_path": "/m/b",
                                                "distillation.teacher_models.b.weight": 3.0})))
    assert "teacher teacher_model: /m/teacher (every row, weight 1.0)" in plan
    assert "teacher b: /m/b (every row, weight 3.0)" in plan


@pytest.mark.timeout(30)
def test_a_topk_mode_is_accepted_and_the_plan_names_its_support(small_cfg):
    typed = typed_config(small_cfg({**ON, "distillation.distillation_loss.loss_mode": "forward_kl_topk",
                                    "distillation.distillation_loss.topk": 4}))
    assert typed.distillation.distillation_loss.topk == 4
    assert ("distillation: forward_kl_topk over the union of the student's and the teacher's top-4 on the student's "
            "samples, coef=1.0; actor loss += coef x divergence") in dry_run_plan(typed)
