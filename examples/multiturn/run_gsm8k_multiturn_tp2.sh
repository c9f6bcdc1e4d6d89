#!/usr/bin/env bash
# A downscaled copy of verl's examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh: multi-turn GRPO with a
# tool, KL loss (low_var_kl), the reference offloaded, and rollout tensor parallelism 2 on GPU (the TP block's first
# rank runs the block's agent loops; vLLM's peers replay its engine calls, SGLang's engine runs the TP schedulers).
#
#   bash examples/multiturn/run_gsm8k_multiturn_tp2.sh                         # CPU: 2 workers, vLLM, TP 1, 2 steps
#   DEVICE=gpu bash examples/multiturn/run_gsm8k_multiturn_tp2.sh              # 2 GPUs, SGLang, TP 2 (verl's engine)
#   DEVICE=gpu ENGINE=vllm bash examples/multiturn/run_gsm8k_multiturn_tp2.sh  # 2 GPUs, vLLM, TP 2
#   TP=2 bash examples/multiturn/run_gsm8k_multiturn_tp2.sh                    # CPU, vLLM TP 2 (gloo), slower
#   bash examples/multiturn/run_gsm8k_multiturn_tp2.sh trainer.total_training_steps=10   # any override, last wins
#
# Data and model: by default the calculator task and the tiny SFT'd model of run_tiny_cpu.sh (built on first use
# under $WORK_DIR). verl's own setting, on a host with the model and GSM8K (examples/data_preprocess/gsm8k.py):
#   DEVICE=gpu MODEL_PATH=Qwen/Qwen2.5-3B-Instruct DATA_DIR=~/data/gsm8k TOOL=gsm8k PROMPT_LEN=1024 RESPONSE_LEN=1024 \
#       bash examples/multiturn/run_gsm8k_multiturn_tp2.sh data.train_batch_size=256 actor_rollout_ref.rollout.n=16
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG="$REPO_ROOT/examples/multiturn/config"
DEVICE=${DEVICE:-cpu}
WORK_DIR=${WORK_DIR:-/tmp/rlpost_multiturn}
SFT_STEPS=${SFT_STEPS:-60}
TOOL=${TOOL:-calculator}
case "$DEVICE" in
  cpu) ENGINE=${ENGINE:-vllm}; TP=${TP:-1}; DEVICE_ARGS=(trainer.device=cpu ray_init.num_cpus=2) ;;
  gpu) ENGINE=${ENGINE:-sglang}; TP=${TP:-2}; DEVICE_ARGS=(trainer.device=cuda) ;;
  *) echo "DEVICE=$DEVICE: expected cpu or gpu" >&2; exit 2 ;;
esac
case "$TOOL" in
  calculator) TOOL_CONFIG="$CONFIG/tool_config/calculator_tool_config.yaml" ;;
  gsm8k) TOOL_CONFIG="$CONFIG/tool_config/gsm8k_tool_config.yaml" ;;
  *) echo "TOOL=$TOOL: expected calculator or gsm8k" >&2; exit 2 ;;
esac
if [ -z "${MODEL_PATH:-}" ] || [ -z "${DATA_DIR:-}" ]; then
  # the tiny model and the calculator data, as run_tiny_cpu.sh builds them
  WORK_DIR="$WORK_DIR" SFT_STEPS="$SFT_STEPS" PREPARE_ONLY=1 bash "$REPO_ROOT/examples/multiturn/run_tiny_cpu.sh"
  MODEL_PATH=${MODEL_PATH:-$WORK_DIR/sft/global_step_$SFT_STEPS}
  DATA_DIR=${DATA_DIR:-$WORK_DIR/data}
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}

OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} python3 -m rlpost.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=4 \
    data.max_prompt_length=${PROMPT_LEN:-200} \
    data.max_response_length=${RESPONSE_LEN:-96} \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.return_raw_chat=True \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" \
    actor_rollout_ref.rollout.name="$ENGINE" \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console"]' \
    trainer.project_name=rlpost_examples \
    trainer.experiment_name=gsm8k_multiturn_tp${TP}_${ENGINE}_${DEVICE} \
    trainer.default_local_dir="$WORK_DIR/gsm8k_multiturn_tp${TP}_${ENGINE}_${DEVICE}" \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=-1 \
    trainer.val_before_train=False \
    trainer.total_epochs=1 \
    trainer.total_training_steps=2 \
    actor_rollout_ref.hybrid_engine=True \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
    actor_rollout_ref.rollout.multi_turn.format=qwen \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOL_CONFIG" \
    "${DEVICE_ARGS[@]}" \
    "$@"
