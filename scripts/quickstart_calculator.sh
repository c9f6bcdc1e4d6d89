#!/usr/bin/env bash
# The TASK=calculator stage list of scripts/quickstart.sh (sourced by it: uses its ROOT, MODEL, DATA, RUN_DIR and
# its functions log, sft and rl).
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

if [ ! -f "$DATA/train.parquet" ]; then
  log "writing the calculator task to $DATA"
  python examples/data_preprocess/calculator.py --local_dir "$DATA" --tools_config "$TOOLS" \
      --train_size 3000 --test_size 100 --num_digits 4 --b_digits 4 --full_width --tool_rate 0.3 --copy_all --seed 0
fi
if [ ! -f "$MODEL/config.json" ]; then
  log "building the tiny model in $MODEL (tokenizer trained on the task's text)"
  python scripts/make_tiny_model.py --out_dir "$MODEL" --corpus_file "$DATA/corpus.txt" --vocab_size 1024 --seed 0
fi

# one loss line per step would fill the console; they go to $SFT_DIR/metrics.jsonl
sft "transcripts from the teacher that calls the calculator 30% of the time" \
    data.prompt_key=prompt data.response_key=response data.tools_key=tools data.max_length=256 trainer.logger='[file]'
rl grpo_calculator "grpo with tool_agent: $GRPO_STEPS steps, 2 CPU worker processes with vLLM; greedy validation before and after" \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOLS" "$@"
python scripts/quickstart_eval.py "$RUN_DIR" --tool_calls
