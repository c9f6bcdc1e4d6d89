#!/usr/bin/env bash
# The TASK=code stage list of scripts/quickstart.sh (sourced by it: uses its ROOT, MODEL, DATA, RUN_DIR and its
# functions log, sft and rl).
#
# 1. the task: "Write a Python program that reads N and prints N times 7." (plus, minus, times, modulo; K in
#    [2, 9], one digit, one token to copy; 16 held-out (operator, K) pairs, two per K, never seen in training,
#    each K seen there with the other two operators), 3 hidden stdin/stdout tests per question
#    (examples/data_preprocess/code_synth.py --family ops). The SFT teacher writes the wrong operator in 70% of its
#    programs (plus -> *, times -> +, minus -> +, modulo -> //).
# 2. a tiny model whose tokenizer is trained on that text
# 3. SFT on the teacher's programs: greedy decoding then writes the teacher's usual, wrong operator
# 4. GRPO (examples/quickstart/grpo_code.yaml) with url=local: the trainer starts rlpost's sandbox, every sampled
#    program runs on its hidden tests, the reward is the pass fraction
# 5. prints `held-out pass rate: before=.. after=..` (greedy, the last line)
if [ ! -f "$DATA/train.parquet" ]; then
  log "writing the code task to $DATA"
  python examples/data_preprocess/code_synth.py --family ops --local_dir "$DATA" --train_size 3000 --test_size 16 --n_cases 3 \
      --sft_slip 0.7 --k_max 9 --seed 0
fi
if [ ! -f "$MODEL/config.json" ]; then
  log "building the tiny model in $MODEL (tokenizer trained on the task's text)"
  python scripts/make_tiny_model.py --out_dir "$MODEL" --corpus_file "$DATA/corpus.txt" --vocab_size 1024 --seed 0
fi

sft "programs from the teacher that uses the wrong operator 70% of the time" data.max_length=64 \
    trainer.logger='[file]'
rl grpo_code "grpo on programs run in the sandbox: $GRPO_STEPS steps, 2 CPU worker processes with vLLM; greedy validation before and after" "$@"
python scripts/quickstart_eval.py "$RUN_DIR" --metric val-core/rlpost/code/reward/mean@1 --label "held-out pass rate"
