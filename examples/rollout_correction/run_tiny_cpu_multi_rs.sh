#!/usr/bin/env bash
# GRPO with several rejection criteria in bypass mode (verl's
# examples/rollout_correction/run_with_rollout_corr_multi_rs.sh, scaled down): PPO clipping against the rollout's
# log-probs; a token is dropped from the loss when its ratio pi / pi_rollout leaves [0.6, 1.6] (token_k1) or when
# its row's largest 0.5 log(ratio)^2 is above 2.5 (seq_max_k2). The tiny Qwen2 model on the synthetic arithmetic
# task: 2 CPU worker processes, 2 steps.
#
#   bash examples/rollout_correction/run_tiny_cpu_multi_rs.sh [key=value ...]     # extra overrides go last and win
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
tiny_cpu_setup rollout_corr_multi_rs_tiny_cpu

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=grpo \
    "${MULTI_RS_PPO_CLIP[@]}" \
    "${CORRECTION_COMMON[@]}" \
    data.train_batch_size=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.rollout.n=4 \
    "$@"
