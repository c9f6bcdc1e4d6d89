#!/usr/bin/env bash
# On-policy distillation on the synthetic arithmetic task: a tiny Qwen2 student, its teacher at TEACHER_PATH
# (default: the student's own folder, i.e. self-distillation from a frozen copy), 2 CPU worker processes beside
# the teacher, 2 steps. The per-token k1 reverse KL is the advantage (verl's run_qwen3_8b_fsdp.sh settings).
#
#   TEACHER_PATH=/models/tiny-teacher bash examples/on_policy_distillation_trainer/run_tiny_cpu.sh [key=value ...]
# Overrides shared with the other examples come from examples/common.sh; this script adds its own.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
tiny_cpu_setup distillation_tiny_cpu
TEACHER_PATH=${TEACHER_PATH:-$MODEL_PATH}

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.n=2 \
    algorithm.use_kl_in_reward=false \
    distillation.enabled=true \
    distillation.teacher_models.teacher_model.model_path="$TEACHER_PATH" \
    distillation.distillation_loss.loss_mode=k1 \
    distillation.distillation_loss.use_policy_gradient=true \
    distillation.distillation_loss.use_task_rewards=false \
    distillation.distillation_loss.loss_max_clamp=10.0 \
    distillation.distillation_loss.log_prob_min_clamp=-10.0 \
    "$@"
