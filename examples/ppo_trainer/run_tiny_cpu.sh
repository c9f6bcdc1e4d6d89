#!/usr/bin/env bash
# PPO (GAE advantages, critic) on the synthetic arithmetic task with a tiny Qwen2 model: 2 CPU worker processes, 2 steps.
# Builds the model and the data on first use. Runs on a laptop in a few minutes.
#
#   bash examples/ppo_trainer/run_tiny_cpu.sh [key=value ...]     # extra overrides go last and win
set -euo pipefail
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MODEL_PATH=${MODEL_PATH:-$HOME/models/tiny-qwen2}
DATA_DIR=${DATA_DIR:-$HOME/data/arith_tiny}
CKPT_DIR=${CKPT_DIR:-/tmp/rlpost_examples/ppo_tiny_cpu}

[ -f "$MODEL_PATH/config.json" ] || python3 "$ROOT/scripts/make_tiny_model.py" --out_dir "$MODEL_PATH"
[ -f "$DATA_DIR/train.parquet" ] || python3 "$ROOT/examples/data_preprocess/arith.py" --local_dir "$DATA_DIR" \
    --train_size 64 --test_size 8

python3 -m rlpost.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    data.train_files=$DATA_DIR/train.parquet \
    data.val_files=$DATA_DIR/test.parquet \
    data.train_batch_size=8 \
    data.max_prompt_length=64 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    critic.optim.lr=1e-4 \
    critic.model.path=$MODEL_PATH \
    critic.ppo_micro_batch_size_per_gpu=2 \
    algorithm.use_kl_in_reward=false \
    trainer.device=cpu \
    trainer.logger='["console"]' \
    trainer.project_name=rlpost_examples \
    trainer.experiment_name=ppo_tiny_cpu \
    trainer.default_local_dir=$CKPT_DIR \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=2 \
    trainer.total_epochs=1 \
    trainer.total_training_steps=2 \
    "$@"
