"""Start-up rules of on-policy distillation (`distillation.*`): teachers, the loss, the teachers' pool.

A teacher added on the command line with only some keys (`+distillation.teacher_models.gsm8k.model_path=...`,
as verl's multi-teacher scripts do) gets the rest from the default entry (`teacher_model`) first.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from rlpost.algos.distillation import DISTILLATION_LOSSES, TOPK_MODES
from rlpost.config.schema import PPOTrainerConfig
from rlpost.trainer.config.errors import warn
from rlpost.trainer.config.rules import fail

D = "distillation"
LOSS = f"{D}.distillation_loss"
TEMPLATE = "teacher_model"


def fill_teacher_entries(cfg: DictConfig) -> None:
    """Complete every `distillation.teacher_models.<name>` with the default entry's keys it lacks (in place)."""
    from rlpost.trainer.config.defaults import package_defaults

    teachers = OmegaConf.select(cfg, f"{D}.teacher_models", default=None)
    if not isinstance(teachers, DictConfig):
        return
    template = package_defaults()[D]["teacher_models"][TEMPLATE]
    with open_dict(teachers):
        for name in list(teachers):
            entry = teachers[name]
            if isinstance(entry, DictConfig):
                teachers[name] = OmegaConf.merge(template, entry)


def check_distillation(c: PPOTrainerConfig) -> None:
    """The loss mode is built; enabled, there is a teacher, several teachers each have their own `key`, and the
    teachers' pool has devices."""
    d, loss = c.distillation, c.distillation.distillation_loss
    if loss.loss_mode not in DISTILLATION_LOSSES:
        fail(f"{LOSS}.loss_mode={loss.loss_mode}", f"not a distillation loss mode ({DISTILLATION_LOSSES.names()})",
             f"{LOSS}.loss_mode=k3")
    teachers = d.teachers()
    if not d.enabled:
        if teachers:
            warn(f"{D}.teacher_models.{next(iter(teachers))}.model_path is set but {D}.enabled=false: no teacher "
                 f"is created (set {D}.enabled=true to distil)")
        return
    if loss.loss_mode in TOPK_MODES:
        _check_topk(c)
    if loss.policy_loss_mode != "vanilla":
        fail(f"not supported yet: {LOSS}.policy_loss_mode={loss.policy_loss_mode}", "the distillation advantages "
             "go through the actor's own policy loss (actor_rollout_ref.actor.policy_loss.loss_mode)",
             f"{LOSS}.policy_loss_mode=vanilla")
    if not teachers:
        fail(f"{D}.enabled=true, every {D}.teacher_models.<name>.model_path=null", "distillation needs a teacher",
             f"{D}.teacher_models.{TEMPLATE}.model_path=<HF model folder> (the policy's own path: self-distillation "
             f"from a frozen copy of the initial policy)")
    for name, t in teachers.items():
        if t.weight <= 0:
            fail(f"{D}.teacher_models.{name}.weight={t.weight}", "a teacher's weight in the mixture is > 0",
                 f"{D}.teacher_models.{name}.weight=1.0")
    if len(teachers) > 1:
        keys = [t.key for t in teachers.values()]
        unkeyed = [n for n, t in teachers.items() if t.key is None]
        if unkeyed and len(unkeyed) < len(teachers):
            fail(f"{D}.teacher_models.{unkeyed[0]}.key=null beside teachers with a key",
                 f"either each teacher scores the rows whose {D}.teacher_key ({d.teacher_key}) equals its key, or "
                 "every teacher scores every row (mixed by weight)",
                 f"{D}.teacher_models.{unkeyed[0]}.key=<a {d.teacher_key} value of your data>")
        if not unkeyed and len(set(keys)) < len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            fail(f"{D}.teacher_models.*.key={dup} on two teachers", "a row has one teacher",
                 "a distinct key per teacher")
    if d.nnodes < 0 or (d.nnodes > 0 and d.n_gpus_per_node < 1):
        fail(f"{D}.nnodes={d.nnodes}, {D}.n_gpus_per_node={d.n_gpus_per_node}",
             "the teachers' own pool needs at least one device (nnodes=0: they share the trainer's devices)",
             f"{D}.nnodes=1 {D}.n_gpus_per_node=1, or {D}.nnodes=0")
    if loss.distillation_loss_coef < 0:
        fail(f"{LOSS}.distillation_loss_coef={loss.distillation_loss_coef}", "a weight is >= 0",
             f"{LOSS}.distillation_loss_coef=1.0")
    written = _written_inference()
    for name, t in teachers.items():
        if any(t.inference.get(k) != v for k, v in written.items()):
            warn(f"{D}.teacher_models.{name}.inference accepted: rlpost's teacher is an FSDP forward-only model "
                 f"(the reference's fsdp_config and log_prob_* micro-batching), not an inference engine; these "
                 f"settings are not used")
            break


def _check_topk(c: PPOTrainerConfig) -> None:
    """A top-k mode: k >= 1, a loss term (not advantages), one teacher per row, no sequence parallelism."""
    d, loss = c.distillation, c.distillation.distillation_loss
    if loss.topk is None or loss.topk < 1:
        fail(f"{LOSS}.topk={loss.topk} with {LOSS}.loss_mode={loss.loss_mode}", "a top-k mode needs k >= 1",
             f"{LOSS}.topk=32")
    if loss.use_policy_gradient:
        fail(f"not supported yet: {LOSS}.use_policy_gradient=true with {LOSS}.loss_mode={loss.loss_mode}",
             "the top-k divergence is a term of the actor's loss", f"{LOSS}.use_policy_gradient=false")
    unkeyed = [n for n, t in d.teachers().items() if t.key is None]
    if len(d.teachers()) > 1 and unkeyed:
        fail(f"not supported yet: {LOSS}.loss_mode={loss.loss_mode} with several teachers without a key",
             "teachers' top-k supports differ, so they are not mixed", f"{D}.teacher_models.<name>.key per teacher, "
             f"or {LOSS}.loss_mode=k3")
    sp = c.actor_rollout_ref.actor.ulysses_sequence_parallel_size
    if sp > 1:
        fail(f"not supported yet: {LOSS}.loss_mode={loss.loss_mode} with "
             f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}", "the top-k forward runs whole rows",
             "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1")


def _written_inference() -> dict:
    """The default entry's inference settings that are plain values (not following a rollout key)."""
    from rlpost.trainer.config.defaults import package_defaults

    raw = OmegaConf.to_container(package_defaults()[D]["teacher_models"][TEMPLATE]["inference"], resolve=False)
    return {k: v for k, v in raw.items() if not (isinstance(v, str) and "${" in v)}


def _weights(model_path: str, shards: int) -> str:
    """'; <params>, <GiB> of bf16 weights per device' from the folder's config.json, '' without a readable one."""
    import os

    from rlpost.utils.memory_estimate import GIB, load_shape

    if not os.path.isfile(os.path.join(os.path.expanduser(model_path), "config.json")):
        return ""
    try:
        params = load_shape(model_path).params
    except (KeyError, ValueError, TypeError):  # a config.json without a decoder's shape: no size to print
        return ""
    return f"; {params / 1e6:.1f}M parameters, {2 * params / shards / GIB:.2f} GiB of bf16 weights per device"


def distillation_plan(c: PPOTrainerConfig) -> list[str]:
    """Dry-run lines: where the teachers run, which rows each scores, and the loss."""
    d = c.distillation
    if not d.enabled:
        return []
    loss = d.distillation_loss
    where = (f"their own pool of {d.nnodes * d.n_gpus_per_node} devices ({D}.nnodes={d.nnodes} x n_gpus_per_node="
             f"{d.n_gpus_per_node})" if d.nnodes > 0 else "the trainer's devices (beside the actor)")
    lines = [f"teachers: FSDP forward-only on {where}"]
    shards = d.nnodes * d.n_gpus_per_node if d.nnodes > 0 else c.trainer.nnodes * c.trainer.n_gpus_per_node
    for name, t in d.teachers().items():
        mixed = len(d.teachers()) > 1 and t.key is None
        rows = f"every row, weight {t.weight}" if mixed else "every row" if t.key is None else \
            f"rows with {d.teacher_key}={t.key}"
        lines.append(f"  teacher {name}: {t.model_path} ({rows}){_weights(t.model_path, shards)}")
    how = ("advantage = -divergence per token" + (" + task advantage" if loss.use_task_rewards else "")
           if loss.use_policy_gradient else
           "actor loss += coef x divergence" + ("" if loss.use_task_rewards else " (task advantages zeroed)"))
    what = (f"over the union of the student's and the teacher's top-{loss.topk}" if loss.loss_mode in TOPK_MODES
            else "reverse KL")
    lines.append(f"distillation: {loss.loss_mode} {what} on the student's samples, coef="
                 f"{loss.distillation_loss_coef}; {how}")
    return lines
