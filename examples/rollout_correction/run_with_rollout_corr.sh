#!/usr/bin/env bash
# RLOO with rollout correction in bypass mode, as verl's examples/rollout_correction/run_with_rollout_corr.sh:
# self-normalised sequence-level importance weights (truncated at 2) and the REINFORCE loss, no old-log-prob pass.
# GSM8K with Qwen2.5-0.5B-Instruct (or any model of that size; MODEL_PATH) on one node of N_GPUS GPUs. Prepare the
# data first (nothing is downloaded):
#   python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k_raw --output_dir ~/data/gsm8k
#
#   MODEL_PATH=/models/Qwen2.5-0.5B-Instruct N_GPUS=1 bash examples/rollout_correction/run_with_rollout_corr.sh [key=value ...]
# Watch rollout_corr/rejected_frac and actor/ppo_kl (the mean log pi_rollout - log pi over the kept tokens).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"
gsm8k_gpu_setup rollout_corr_rloo_seq_is

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=rloo \
    "${SEQ_IS_REINFORCE[@]}" \
    "${CORRECTION_COMMON[@]}" \
    actor_rollout_ref.actor.optim.lr=5e-7 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.n=8 \
    "$@"
