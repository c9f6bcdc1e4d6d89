"""Batch arithmetic checked at start-up: every global size splits into whole per-device pieces.

Sizes in the config are global and counted in prompts (`ppo_mini_batch_size`) or per device and
counted in responses (`*_micro_batch_size_per_gpu`); a worker normalises a mini-batch per data-parallel rank as
`ppo_mini_batch_size * rollout.n / dp` responses, dp = devices / the role's Ulysses size (docs/design.md).
"""

import math

from rlpost.trainer.config.roles import need_critic
from rlpost.trainer.config.rules import ARR, fail
from rlpost.config.schema import PPOTrainerConfig


def n_devices(c: PPOTrainerConfig) -> int:
    """Devices (GPUs, or worker processes with trainer.device=cpu) over all nodes."""
    return c.trainer.nnodes * c.trainer.n_gpus_per_node


def check_batch_sizes(c: PPOTrainerConfig) -> None:
    """Train batch over devices, mini-batches over the train batch, micro-batches over mini-batches."""
    devices, n, train = n_devices(c), c.actor_rollout_ref.rollout.n, c.data.train_batch_size
    if (train * n) % devices:
        step = devices // math.gcd(n, devices)
        fail(
            f"data.train_batch_size={train} x actor_rollout_ref.rollout.n={n} = {train * n} responses, "
            f"trainer.nnodes x trainer.n_gpus_per_node = {devices} devices",
            "the responses of a step must split evenly over the devices",
            f"data.train_batch_size={max(step, round(train / step) * step)}",
        )
    actor = c.actor_rollout_ref.actor
    _check_role(f"{ARR}.actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu,
                actor.use_dynamic_bsz, train, n, devices // actor.ulysses_sequence_parallel_size)
    if need_critic(c):
        critic = c.critic
        _check_role("critic", critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu,
                    critic.use_dynamic_bsz, train, n, devices // critic.ulysses_sequence_parallel_size)
    _check_forward_micro_batches(c)
    _check_lengths(c, devices)


def _check_role(prefix: str, mini: int, micro: int | None, dynamic: bool, train: int, n: int, dp: int) -> None:
    """Mini-batches over the train batch and over the `dp` data-parallel ranks, micro-batches over those."""
    key = f"{prefix}.ppo_mini_batch_size"
    ok = [d for d in range(1, train + 1) if train % d == 0 and (d * n) % dp == 0]
    best = max([d for d in ok if d <= mini] or ok or [1])
    if mini * n > train * n:
        fail(f"{key}={mini} (x rollout.n={n} = {mini * n} responses) > data.train_batch_size x rollout.n "
             f"= {train * n}", "mini_batch > train_batch x n: a mini-batch cannot exceed the step's batch",
             f"{key}={best}")
    if train % mini:
        fail(f"{key}={mini}, data.train_batch_size={train}",
             "ppo_mini_batch_size must divide train_batch_size (whole mini-batches per step)", f"{key}={best}")
    if (mini * n) % dp:
        fail(f"{key}={mini} x rollout.n={n} = {mini * n} responses, {dp} data-parallel ranks "
             "(devices / ulysses_sequence_parallel_size)", "a mini-batch must split evenly over the data-parallel "
             "ranks", f"{key}={best}")
    if dynamic:
        return
    per_rank = mini * n // dp
    micro_key = f"{prefix}.ppo_micro_batch_size_per_gpu"
    if micro is None or micro < 1:
        fail(f"{micro_key}={micro}", "must be an integer >= 1 when use_dynamic_bsz=false",
             f"{micro_key}={min(per_rank, 8)}")
    if per_rank % micro:
        fix = max(d for d in range(1, min(micro, per_rank) + 1) if per_rank % d == 0)
        fail(f"{micro_key}={micro}, mini-batch per data-parallel rank = {key} x rollout.n / dp = {per_rank}",
             "the mini-batch per data-parallel rank must be a whole number of micro-batches", f"{micro_key}={fix}")


def _check_forward_micro_batches(c: PPOTrainerConfig) -> None:
    arr = c.actor_rollout_ref
    dynamic = arr.actor.use_dynamic_bsz
    sizes = {
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu": (arr.rollout.log_prob_micro_batch_size_per_gpu,
                                                             arr.rollout.log_prob_use_dynamic_bsz),
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": (arr.ref.log_prob_micro_batch_size_per_gpu,
                                                         arr.ref.log_prob_use_dynamic_bsz),
        "critic.forward_micro_batch_size_per_gpu": (c.critic.forward_micro_batch_size_per_gpu,
                                                    c.critic.use_dynamic_bsz),
        "reward_model.micro_batch_size_per_gpu": (c.reward_model.micro_batch_size_per_gpu,
                                                  c.reward_model.use_dynamic_bsz or dynamic),
    }
    for key, (value, uses_tokens) in sizes.items():
        if (value is None and not uses_tokens) or (value is not None and value < 1):
            fail(f"{key}={'null' if value is None else value}",
                 "must be an integer >= 1 (null only with dynamic batch size)", f"{key}=16")


def _check_lengths(c: PPOTrainerConfig, devices: int) -> None:
    rollout, actor = c.actor_rollout_ref.rollout, c.actor_rollout_ref.actor
    longest = c.data.max_prompt_length + c.data.max_response_length
    sp = actor.ulysses_sequence_parallel_size  # a Ulysses group's devices share each micro-batch
    if actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu * sp < longest:
        key = f"{ARR}.actor.ppo_max_token_len_per_gpu"
        fail(f"{key}={actor.ppo_max_token_len_per_gpu} x ulysses_sequence_parallel_size={sp}, "
             f"data.max_prompt_length + data.max_response_length = {longest}",
             "one full-length sample must fit in a dynamic micro-batch", f"{key}={-(-longest // sp)}")
    if rollout.max_model_len is not None and rollout.max_model_len < rollout.prompt_length + rollout.response_length:
        key = f"{ARR}.rollout.max_model_len"
        total = rollout.prompt_length + rollout.response_length
        fail(f"{key}={rollout.max_model_len}, prompt_length + response_length = {total}",
             "the engine must hold a full prompt plus response", f"{key}={total}")
    tp = rollout.tensor_model_parallel_size
    if devices % tp:
        key = f"{ARR}.rollout.tensor_model_parallel_size"
        fix = max(d for d in range(1, tp + 1) if devices % d == 0)
        fail(f"{key}={tp}, {devices} devices", "tensor-parallel groups must tile the devices", f"{key}={fix}")
