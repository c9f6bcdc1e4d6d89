#!/usr/bin/env bash
# PPO (GAE advantages, critic) on GSM8K with Qwen2.5-0.5B-Instruct (or any model of that size) on one node of GPUs.
# Prepare the data first (nothing is downloaded; see the script's docstring):
#   python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k_raw --output_dir ~/data/gsm8k
#
#   MODEL_PATH=/models/Qwen2.5-0.5B-Instruct N_GPUS=1 bash examples/ppo_trainer/run_qwen2_5_0_5b_gpu.sh [key=value ...]
# Overrides shared with the other examples come from examples/common.sh; this script adds its own.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
gsm8k_gpu_setup ppo_qwen2_5_0_5b_gsm8k
# the actor's token budget comes from common.sh's small-model settings when they are on; the critic follows them
ACTOR_BSZ=()
[[ ${#FAST[@]} -eq 0 ]] && ACTOR_BSZ=(actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768)
CRITIC_FAST=()
[[ ${#FAST[@]} -gt 0 ]] && CRITIC_FAST=(critic.model.fsdp_config.wrap_policy.min_num_params="$FSDP_MIN_NUM_PARAMS"
                                        critic.model.fsdp_config.reshard_after_forward=false
                                        critic.model.fsdp_config.use_no_sync_for_gradient_accumulation=true)

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=gae \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    "${ACTOR_BSZ[@]}" \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.n=1 \
    critic.optim.lr=1e-5 \
    critic.model.path="$MODEL_PATH" \
    critic.model.use_remove_padding=true \
    critic.model.enable_gradient_checkpointing="$GRAD_CKPT" \
    critic.ppo_micro_batch_size_per_gpu=8 \
    critic.use_dynamic_bsz=true \
    critic.ppo_max_token_len_per_gpu=32768 \
    critic.model.fsdp_config.param_offload=false \
    critic.model.fsdp_config.optimizer_offload=false \
    algorithm.use_kl_in_reward=false \
    "${CRITIC_FAST[@]}" \
    "$@"
