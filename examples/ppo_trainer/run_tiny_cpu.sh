#!/usr/bin/env bash
# PPO (GAE advantages, critic) on the synthetic arithmetic task with a tiny Qwen2 model: 2 CPU worker processes, 2 steps.
# Builds the model and the data on first use. Runs on a laptop in a few minutes.
#
#   bash examples/ppo_trainer/run_tiny_cpu.sh [key=value ...]     # extra overrides go last and win
# Overrides shared with the other examples come from examples/common.sh; this script adds its own.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
tiny_cpu_setup ppo_tiny_cpu

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=gae \
    data.train_batch_size=8 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.n=1 \
    critic.optim.lr=1e-4 \
    critic.model.path="$MODEL_PATH" \
    critic.ppo_micro_batch_size_per_gpu=2 \
    algorithm.use_kl_in_reward=false \
    "$@"
