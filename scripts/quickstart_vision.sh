#!/usr/bin/env bash
# The TASK=vision stage list of scripts/quickstart.sh (sourced by it: uses its ROOT, MODEL, DATA, RUN_DIR and its
# functions log, sft and rl).
#
# 1. the task: "Which colour is the square?" on generated 56x56 pictures (examples/data_preprocess/vision_colour.py);
#    the question text is the same on every row, so the answer is only in the pixels. The SFT teacher names the
#    next colour (red -> green -> blue -> yellow -> red) in 60% of its answers.
# 2. a tiny Qwen2-VL-architecture model and its processor (random weights, offline)
# 3. SFT on the teacher's answers with the pictures (fsdp_sft_trainer, data.image_key=images): greedy decoding
#    then names the teacher's usual, wrong colour
# 4. GRPO (examples/quickstart/grpo_vision.yaml) with vLLM getting the pictures; the reward is the exact colour
# 5. prints `held-out accuracy: before=.. after=..` (greedy, unseen pictures) and, last,
#    `images blanked: after=..`: the same held-out rows with white pictures, where no model can beat chance (0.25)
if [ ! -f "$DATA/train.parquet" ]; then
  log "writing the colour task to $DATA"
  python examples/data_preprocess/vision_colour.py --local_dir "$DATA" --train_size 512 --test_size 64 \
      --sft_size 512 --sft_slip 0.6 --seed 0
fi
if [ ! -f "$MODEL/config.json" ]; then
  log "building the tiny vision-language model in $MODEL"
  python scripts/make_tiny_model.py --out_dir "$MODEL" --arch qwen2_vl --corpus_file "$DATA/corpus.txt" --seed 0
fi

sft "pictures with the answers of a teacher that names the wrong colour 60% of the time" \
    data.prompt_key=prompt data.response_key=response data.image_key=images data.max_length=32 \
    trainer.logger='[file]'
rl grpo_vision "grpo on the pictures: $GRPO_STEPS steps, 2 CPU worker processes with vLLM; greedy validation before and after" "$@"
python scripts/quickstart_eval.py "$RUN_DIR" --metric val-core/rlpost/colour/reward/mean@1 \
    --blank_metric val-core/rlpost/colour_blank/reward/mean@1
