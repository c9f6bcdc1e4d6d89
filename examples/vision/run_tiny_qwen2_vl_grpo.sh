#!/usr/bin/env bash
# verl's Qwen2.5-VL GRPO example scripts (examples/grpo_trainer/run_qwen2_5_vl-7b*.sh) downscaled to the tiny
# Qwen2-VL model on 2 CPU cores: 2 steps on the synthetic colour pictures instead of geometry3k (no hub here).
#
#   bash examples/vision/run_tiny_qwen2_vl_grpo.sh [base|freeze_vision|lora|seq_balance] [key=value ...]
#
# Each variant keeps its script's keys and values that matter for what it shows; sizes shrink (batch 512 -> 4,
# n 5 -> 2, lengths 1024/2048 -> 32/6, 8 GPUs -> 2 CPU processes, tensor parallel 2 -> 1); verl's
# use_remove_padding=True is kept (the packed path). Differences, named:
# - use_fused_kernels and enforce_eager=False are GPU settings: left at rlpost's CPU defaults.
# - +actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True is left out (vLLM's
#   preprocessor cache option; rlpost resets the engine's encoder cache at every weight sync).
# - lora: adapters on the language model only (exclude_modules keeps them out of the vision tower, whose weights
#   stay frozen as PEFT leaves them); vLLM serves the adapter. Adapters in the tower are refused before Ray.
# All four variants were run for 2 steps on 2 CPU cores (2026-12-03); tests/examples/test_tiny_vl_scripts.py runs
# freeze_vision in CI.
set -euo pipefail
VARIANT=${1:-base}; shift || true
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${WORK:-/tmp/rlpost_tiny_vl}
cd "$ROOT"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} OMP_NUM_THREADS=1
[ -f "$WORK/data/train.parquet" ] || python examples/data_preprocess/vision_colour.py --local_dir "$WORK/data" \
    --train_size 16 --test_size 4 --sft_size 4
[ -f "$WORK/model/config.json" ] || python scripts/make_tiny_model.py --out_dir "$WORK/model" --arch qwen2_vl \
    --corpus_file "$WORK/data/corpus.txt"
case "$VARIANT" in
  base) EXTRA=() ;;
  freeze_vision) EXTRA=(actor_rollout_ref.actor.freeze_vision_tower=True) ;;
  lora) EXTRA=(actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32
               actor_rollout_ref.model.target_modules=all-linear "actor_rollout_ref.model.exclude_modules='.*visual.*'"
               actor_rollout_ref.actor.optim.lr=3e-6 actor_rollout_ref.rollout.free_cache_engine=False) ;;
  seq_balance) EXTRA=(actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96
                      actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=96
                      actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=96
                      actor_rollout_ref.rollout.free_cache_engine=False) ;;
  *) echo "variant $VARIANT: use base, freeze_vision, lora or seq_balance" >&2; exit 2 ;;
esac
python -m rlpost.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$WORK/data/train.parquet" \
    data.val_files="$WORK/data/test.parquet" \
    data.train_batch_size=4 \
    data.max_prompt_length=32 \
    data.max_response_length=6 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    data.image_key=images \
    actor_rollout_ref.model.path="$WORK/model" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.01 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
    actor_rollout_ref.rollout.enable_chunked_prefill=False \
    actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console"]' \
    trainer.project_name='rlpost_tiny_vl' \
    trainer.experiment_name="tiny_qwen2_vl_$VARIANT" \
    trainer.device=cpu \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=2 \
    trainer.total_training_steps=2 \
    ray_init.num_cpus=2 \
    "${EXTRA[@]}" "$@"
