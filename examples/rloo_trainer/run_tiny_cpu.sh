#!/usr/bin/env bash
# RLOO on the synthetic arithmetic task with a tiny Qwen2 model: 2 CPU worker processes, 2 steps.
# Builds the model and the data on first use. Runs on a laptop in a few minutes.
#
#   bash examples/rloo_trainer/run_tiny_cpu.sh [key=value ...]     # extra overrides go last and win
# Overrides shared with the other examples come from examples/common.sh; this script adds its own.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
tiny_cpu_setup rloo_tiny_cpu

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=rloo \
    data.train_batch_size=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.n=4 \
    algorithm.use_kl_in_reward=true \
    algorithm.kl_penalty=kl \
    algorithm.kl_ctrl.kl_coef=0.001 \
    "$@"
