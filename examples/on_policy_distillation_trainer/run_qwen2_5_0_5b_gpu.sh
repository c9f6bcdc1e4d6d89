#!/usr/bin/env bash
# On-policy distillation on GSM8K: Qwen2.5-0.5B-Instruct (the student) from a larger Qwen2.5 teacher of the same
# tokenizer (TEACHER_PATH, default Qwen2.5-1.5B-Instruct), the teacher FSDP-sharded beside the actor and offloaded
# between calls. The per-token k1 reverse KL is the advantage; the task reward is not used.
# Prepare the data first (nothing is downloaded; see the script's docstring):
#   python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k_raw --output_dir ~/data/gsm8k
#
#   MODEL_PATH=/models/Qwen2.5-0.5B-Instruct TEACHER_PATH=/models/Qwen2.5-1.5B-Instruct N_GPUS=1 \
#       bash examples/on_policy_distillation_trainer/run_qwen2_5_0_5b_gpu.sh [key=value ...]
# Overrides shared with the other examples come from examples/common.sh; this script adds its own.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
gsm8k_gpu_setup distillation_qwen2_5_0_5b_gsm8k
TEACHER_PATH=${TEACHER_PATH:-$HOME/models/Qwen2.5-1.5B-Instruct}

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.n=1 \
    algorithm.use_kl_in_reward=false \
    distillation.enabled=true \
    distillation.teacher_models.teacher_model.model_path="$TEACHER_PATH" \
    distillation.distillation_loss.loss_mode=k1 \
    distillation.distillation_loss.use_policy_gradient=true \
    distillation.distillation_loss.use_task_rewards=false \
    distillation.distillation_loss.loss_max_clamp=10.0 \
    distillation.distillation_loss.log_prob_min_clamp=-10.0 \
    "$@"
