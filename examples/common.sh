# Settings shared by the scripts in examples/*_trainer/ (sourced, not run). A script calls one setup
# function, then passes the shared overrides first, its own next and the caller's last (the last wins):
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
#   tiny_cpu_setup grpo_tiny_cpu
#   python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" algorithm.adv_estimator=grpo ... "$@"
#
# Environment: MODEL_PATH, DATA_DIR, CKPT_DIR (tiny CPU) and N_GPUS (GPU) replace the defaults below.

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The synthetic arithmetic task on a tiny Qwen2 model: 2 CPU worker processes, 2 steps. Builds the model
# and the data on first use. $1: the experiment name, also the checkpoint folder's name.
tiny_cpu_setup() {
    export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
    MODEL_PATH=${MODEL_PATH:-$HOME/models/tiny-qwen2}
    DATA_DIR=${DATA_DIR:-$HOME/data/arith_tiny}
    CKPT_DIR=${CKPT_DIR:-/tmp/rlpost_examples/$1}
    [ -f "$MODEL_PATH/config.json" ] || python3 "$REPO_ROOT/scripts/make_tiny_model.py" --out_dir "$MODEL_PATH"
    [ -f "$DATA_DIR/train.parquet" ] || python3 "$REPO_ROOT/examples/data_preprocess/arith.py" \
        --local_dir "$DATA_DIR" --train_size 64 --test_size 8
    COMMON=(
        data.train_files="$DATA_DIR/train.parquet"
        data.val_files="$DATA_DIR/test.parquet"
        data.max_prompt_length=64
        data.max_response_length=16
        actor_rollout_ref.model.path="$MODEL_PATH"
        actor_rollout_ref.actor.optim.lr=1e-5
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.3
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
        trainer.device=cpu
        trainer.logger='["console"]'
        trainer.project_name=rlpost_examples
        trainer.experiment_name="$1"
        trainer.default_local_dir="$CKPT_DIR"
        trainer.n_gpus_per_node=2
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=2
        trainer.total_epochs=1
        trainer.total_training_steps=2
    )
}

# GSM8K with Qwen2.5-0.5B-Instruct (or any model of that size) on one node of N_GPUS GPUs. Nothing is
# downloaded: prepare the data with examples/data_preprocess/gsm8k.py. $1: the experiment name.
gsm8k_gpu_setup() {
    MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen2.5-0.5B-Instruct}
    DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
    N_GPUS=${N_GPUS:-1}
    # The 0.5B model as one FSDP unit (a wrap_policy.min_num_params above its size): one gather and one cast of
    # the weights per pass instead of one per decoder layer; 21.33 s per 64x8-per-GPU step against 23.26 s on four
    # H100s (docs/benchmarks/README.md). It holds the whole bf16 model at once: FSDP_MIN_NUM_PARAMS=0 gives verl's one unit
    # per decoder layer, for 7B and up.
    FSDP_MIN_NUM_PARAMS=${FSDP_MIN_NUM_PARAMS:-1000000000}
    # Small-model speed settings (SMALL_MODEL_FAST=1, the default while the model is one FSDP unit; 0, the default
    # with FSDP_MIN_NUM_PARAMS=0, keeps verl's layout of gradient checkpointing and fixed micro-batches, for 7B
    # and up). On one H200 with the GSM8K-shaped 64x8 batch these took the
    # update from 16 % to 31 % MFU and old_log_prob from 23 % to 36 % (benchmarks/bench_phase_gap.py, "best";
    # docs/benchmarks/realistic.md): no gradient checkpointing (the 0.5B model's activations fit), the log-prob
    # maths compiled (verl's own default), the gathered weights kept from forward to backward, one gradient
    # reduction per mini-batch, and token-budget micro-batches twice verl's example budgets.
    local fast_default=1
    [[ "$FSDP_MIN_NUM_PARAMS" == 0 ]] && fast_default=0
    FAST=()
    GRAD_CKPT=true
    if [[ "${SMALL_MODEL_FAST:-$fast_default}" == 1 ]]; then
        GRAD_CKPT=false
        FAST=(
            actor_rollout_ref.model.use_fused_kernels=true
            actor_rollout_ref.actor.use_torch_compile=true
            actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false
            actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation=true
            actor_rollout_ref.actor.use_dynamic_bsz=true
            actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768
            actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true
            actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536
            actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true
            actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=65536
        )
    fi
    COMMON=(
        data.train_files="$DATA_DIR/train.parquet"
        data.val_files="$DATA_DIR/test.parquet"
        data.train_batch_size=256
        data.max_prompt_length=512
        data.max_response_length=1024
        data.filter_overlong_prompts=true
        data.truncation=error
        actor_rollout_ref.model.path="$MODEL_PATH"
        actor_rollout_ref.model.use_remove_padding=true   # packed rows: 1.41x per step on 28-token prompts padded to 512 (docs/benchmarks/README.md)
        actor_rollout_ref.model.enable_gradient_checkpointing="$GRAD_CKPT"
        actor_rollout_ref.actor.ppo_mini_batch_size=64
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.actor.fsdp_config.param_offload=false
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=false
        actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params="$FSDP_MIN_NUM_PARAMS"
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.enforce_eager=false
        actor_rollout_ref.rollout.max_num_batched_tokens=16384
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
        actor_rollout_ref.ref.fsdp_config.param_offload=true
        actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params="$FSDP_MIN_NUM_PARAMS"
        trainer.critic_warmup=0
        trainer.logger='["console","file"]'
        trainer.project_name=rlpost_examples
        trainer.experiment_name="$1"
        trainer.n_gpus_per_node="$N_GPUS"
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
        "${FAST[@]}"
    )
}
