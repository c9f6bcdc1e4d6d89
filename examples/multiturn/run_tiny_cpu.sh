#!/usr/bin/env bash
# Multi-turn GRPO with a tool on 2 CPU cores: `tool_agent` + the calculator (tools YAML in verl's shape),
# the vLLM CPU engine in 2 worker processes, a tiny model that learned to call the tool by SFT.
#
#   bash examples/multiturn/run_tiny_cpu.sh                       # calculator tool
#   INTERACTION=gsm8k bash examples/multiturn/run_tiny_cpu.sh     # + the GSM8K interaction (retry when wrong)
#   AGENT_LOOP=verl bash examples/multiturn/run_tiny_cpu.sh       # the calculator loop of calculator_agent_loop.py,
#                                                                 # written against verl's agent-loop API
#   bash examples/multiturn/run_tiny_cpu.sh trainer.total_training_steps=10   # any override, last wins
#   PREPARE_ONLY=1 bash examples/multiturn/run_tiny_cpu.sh                    # build data and model, no training
#
# Built on first use under $WORK_DIR (or given by DATA_DIR / MODEL_PATH):
#   1. the task data: examples/data_preprocess/calculator.py ("What is 347 * 29? Use the calculator, ...")
#   2. a tiny Qwen2 model whose tokenizer is trained on the task's text (scripts/make_tiny_model.py)
#   3. SFT on transcripts that call the calculator (data.tools_key=tools: the schemas are in the prompt as in RL)
# then trains. Every step logs multi_turn/* (turns, tool calls, errors, truncation); the rollouts of each
# step, with the model's own tokens apart (`model_text`), go to $WORK_DIR/grpo/rollouts.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG="$REPO_ROOT/examples/multiturn/config"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
WORK_DIR=${WORK_DIR:-/tmp/rlpost_multiturn}
INTERACTION=${INTERACTION:-}
AGENT_LOOP=${AGENT_LOOP:-}
DATA_DIR=${DATA_DIR:-$WORK_DIR/data${INTERACTION:+_$INTERACTION}${AGENT_LOOP:+_$AGENT_LOOP}}
BASE_MODEL=$WORK_DIR/base_model
SFT_STEPS=${SFT_STEPS:-60}
MODEL_PATH=${MODEL_PATH:-$WORK_DIR/sft/global_step_$SFT_STEPS}

if [ ! -f "$DATA_DIR/train.parquet" ]; then
  python3 "$REPO_ROOT/examples/data_preprocess/calculator.py" --local_dir "$DATA_DIR" \
      --tools_config "$CONFIG/tool_config/calculator_tool_config.yaml" --train_size 256 --test_size 8 \
      ${INTERACTION:+--interaction "$INTERACTION"} ${AGENT_LOOP:+--agent_name calculator_agent}
fi
if [ ! -f "$MODEL_PATH/config.json" ]; then
  [ -f "$BASE_MODEL/config.json" ] || python3 "$REPO_ROOT/scripts/make_tiny_model.py" --out_dir "$BASE_MODEL" \
      --corpus_file "$DATA_DIR/corpus.txt" --vocab_size 1024
  OMP_NUM_THREADS=2 python3 -m rlpost.trainer.fsdp_sft_trainer \
      data.train_files="$DATA_DIR/sft_train.parquet" data.val_files=null \
      data.prompt_key=prompt data.response_key=response data.tools_key=tools \
      data.max_length=256 data.train_batch_size=64 data.micro_batch_size_per_gpu=64 \
      model.partial_pretrain="$BASE_MODEL" optim.lr=3e-3 trainer.total_training_steps="$SFT_STEPS" \
      trainer.default_local_dir="$WORK_DIR/sft" trainer.logger='[console]' trainer.device=cpu \
      trainer.n_gpus_per_node=1 trainer.seed=1
fi
if [ -n "${PREPARE_ONLY:-}" ]; then  # data and model only (examples/multiturn/run_gsm8k_multiturn_tp2.sh uses them)
  exit 0
fi

INTERACTION_ARGS=()
if [ -n "$INTERACTION" ]; then
  INTERACTION_ARGS=(
    actor_rollout_ref.rollout.multi_turn.interaction_config_path="$CONFIG/interaction_config/${INTERACTION}_interaction_config.yaml"
    actor_rollout_ref.rollout.multi_turn.max_user_turns=3
    data.max_response_length=192
  )
fi

AGENT_ARGS=()
if [ "$AGENT_LOOP" = verl ]; then
  export PYTHONPATH="$REPO_ROOT/examples/multiturn${PYTHONPATH:+:$PYTHONPATH}"  # the workers import the loop
  AGENT_ARGS=(actor_rollout_ref.rollout.agent.agent_loop_config_path="$CONFIG/agent_loop_config/calculator_agent_loop.yaml")
elif [ -n "$AGENT_LOOP" ]; then
  echo "AGENT_LOOP=$AGENT_LOOP: expected verl (or unset for the built-in tool_agent)" >&2; exit 2
fi

OMP_NUM_THREADS=1 python3 -m rlpost.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=4 \
    data.max_prompt_length=200 \
    data.max_response_length=96 \
    data.return_raw_chat=true \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.optim.lr=1e-4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.rollout.temperature=0.7 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$CONFIG/tool_config/calculator_tool_config.yaml" \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    trainer.device=cpu \
    trainer.logger='["console"]' \
    trainer.project_name=rlpost_examples \
    trainer.experiment_name=multiturn_tiny_cpu${INTERACTION:+_$INTERACTION} \
    trainer.default_local_dir="$WORK_DIR/grpo${INTERACTION:+_$INTERACTION}" \
    trainer.rollout_data_dir="$WORK_DIR/grpo${INTERACTION:+_$INTERACTION}/rollouts" \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=3 \
    trainer.total_epochs=1 \
    trainer.total_training_steps=3 \
    ray_init.num_cpus=2 \
    "${INTERACTION_ARGS[@]}" \
    "${AGENT_ARGS[@]}" \
    "$@"
