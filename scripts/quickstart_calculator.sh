#!/usr/bin/env bash
# The TASK=calculator stage list of scripts/quickstart.sh (sourced by it: uses ROOT, WORK, SFT_STEPS, GRPO_STEPS, log).
#
# 1. the task: "What is 4712 * 8391? Use the calculator, then answer with #### followed by the number."; both
#    factors have 4 digits and every product 8 (examples/data_preprocess/calculator.py --full_width), held-out
#    pairs never seen in training. The SFT teacher calls the calculator on 30% of the questions and otherwise
#    guesses a number near the product; it shows how to copy the tool's result after a call on every question.
# 2. a tiny model whose tokenizer is trained on that text (digits one token each)
# 3. SFT with the tool schemas in the prompt (data.tools_key): greedy decoding then guesses, sampling calls the
#    tool about 3 times in 10
# 4. GRPO with `tool_agent` (examples/quickstart/grpo_calculator.yaml); the reward is 1 for the exact product
# 5. prints `held-out accuracy: before=.. after=..` and `tool-call rate: before=.. after=..` (greedy, last lines)
TOOLS="$ROOT/examples/multiturn/config/tool_config/calculator_tool_config.yaml"
MODEL=$WORK/model
DATA=$WORK/data
SFT_DIR=$WORK/sft
RUN_DIR=$WORK/grpo

if [ ! -f "$DATA/train.parquet" ]; then
  log "writing the calculator task to $DATA"
  python examples/data_preprocess/calculator.py --local_dir "$DATA" --tools_config "$TOOLS" \
      --train_size 3000 --test_size 100 --num_digits 4 --b_digits 4 --full_width --tool_rate 0.3 --copy_all --seed 0
fi
if [ ! -f "$MODEL/config.json" ]; then
  log "building the tiny model in $MODEL (tokenizer trained on the task's text)"
  python scripts/make_tiny_model.py --out_dir "$MODEL" --corpus_file "$DATA/corpus.txt" --vocab_size 1024 --seed 0
fi

SFT_MODEL=$SFT_DIR/global_step_$SFT_STEPS
if [ ! -f "$SFT_MODEL/config.json" ]; then
  # one loss line per step would fill the console; they go to $SFT_DIR/metrics.jsonl
  log "SFT: $SFT_STEPS steps of 64 transcripts from the teacher that calls the calculator 30% of the time"
  OMP_NUM_THREADS=2 python -m rlpost.trainer.fsdp_sft_trainer \
      data.train_files="$DATA/sft_train.parquet" \
      data.val_files=null \
      data.prompt_key=prompt \
      data.response_key=response \
      data.tools_key=tools \
      data.max_length=256 \
      data.train_batch_size=64 \
      data.micro_batch_size_per_gpu=64 \
      model.partial_pretrain="$MODEL" \
      optim.lr=3e-3 \
      trainer.total_training_steps="$SFT_STEPS" \
      trainer.default_local_dir="$SFT_DIR" \
      trainer.logger='[file]' \
      trainer.device=cpu \
      trainer.n_gpus_per_node=1 \
      trainer.seed=1
fi

log "grpo with tool_agent: $GRPO_STEPS steps, 2 CPU worker processes with vLLM; greedy validation before and after"
rm -rf "$RUN_DIR"
start=$SECONDS
OMP_NUM_THREADS=1 python -m rlpost.trainer.main_ppo --config-path="$ROOT/examples/quickstart" \
    --config-name=grpo_calculator \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    actor_rollout_ref.model.path="$SFT_MODEL" \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOLS" \
    trainer.total_training_steps="$GRPO_STEPS" \
    trainer.test_freq="$GRPO_STEPS" \
    trainer.default_local_dir="$RUN_DIR" \
    "$@"
log "grpo wall time: $((SECONDS - start)) s (start-up and both validations included)"
python scripts/quickstart_eval.py "$RUN_DIR" --tool_calls
