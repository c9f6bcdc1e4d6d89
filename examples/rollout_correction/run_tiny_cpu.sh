#!/usr/bin/env bash
# RLOO with rollout correction in bypass mode (verl's examples/rollout_correction/run_with_rollout_corr.sh, scaled
# down): no old-log-prob pass; the loss is REINFORCE, -w * A * log pi, with w the sequence-level importance weight
# pi / pi_rollout truncated at 2 and normalised to mean 1, computed against the current policy in each micro-batch.
# The tiny Qwen2 model on the synthetic arithmetic task: 2 CPU worker processes, 2 steps.
#
#   bash examples/rollout_correction/run_tiny_cpu.sh [key=value ...]     # extra overrides go last and win
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
tiny_cpu_setup rollout_corr_tiny_cpu

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=rloo \
    "${SEQ_IS_REINFORCE[@]}" \
    "${CORRECTION_COMMON[@]}" \
    data.train_batch_size=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.rollout.n=4 \
    "$@"
