#!/usr/bin/env bash
# GRPO with two rejection criteria in bypass mode, as verl's examples/rollout_correction/run_with_rollout_corr_multi_rs.sh:
# PPO clipping against the rollout's log-probs; tokens whose ratio leaves [0.6, 1.6] (token_k1), and rows whose
# largest 0.5 log(ratio)^2 is above 2.5 (seq_max_k2), leave the loss.
# GSM8K with Qwen2.5-0.5B-Instruct (or any model of that size; MODEL_PATH) on one node of N_GPUS GPUs. Prepare the
# data first (nothing is downloaded):
#   python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k_raw --output_dir ~/data/gsm8k
#
#   MODEL_PATH=/models/Qwen2.5-0.5B-Instruct N_GPUS=1 bash examples/rollout_correction/run_with_rollout_corr_multi_rs.sh [key=value ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
gsm8k_gpu_setup rollout_corr_ppo_clip_multi_rs

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=grpo \
    "${MULTI_RS_PPO_CLIP[@]}" \
    "${CORRECTION_COMMON[@]}" \
    actor_rollout_ref.actor.optim.lr=3e-6 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.n=8 \
    "$@"
