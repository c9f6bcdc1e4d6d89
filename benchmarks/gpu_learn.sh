#!/usr/bin/env bash
# A GPU-size run that learns (issue 48, item 4): a Qwen2.5-0.5B-architecture model trained from scratch on one
# GPU, SFT on the calculator task's transcripts, then GRPO with `tool_agent` through `main_ppo` at 64 prompts x 8.
#
#   bash benchmarks/gpu_learn.sh                      # GPU host, from the repository root, after gpu_install.sh
#   SIZE=tiny DEVICE=cpu SFT_STEPS=2 GRPO_STEPS=1 bash benchmarks/gpu_learn.sh   # the same stages on CPU (tiny)
#
# The model: hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864 (Qwen2.5-0.5B's shape) with the task's
# own 1024-token tokenizer (digits one token each), so ~0.36 B parameters instead of 0.49 B (the embedding is
# what shrinks). The task is scripts/quickstart_calculator.sh's, with 5-digit x 5-digit products (10 digits):
# the teacher calls the calculator on 30 % of the questions and guesses a nearby number otherwise, so after SFT
# the greedy answer is a guess; GRPO on the exact-product reward has to make the model call the tool.
# Output in $WORK (default /tmp/gpu_learn): sft/metrics.jsonl, grpo/metrics.jsonl (validation every
# $TEST_FREQ steps: the curve), console.log; the last lines are quickstart_eval.py's before/after lines and
# the wall times. The rollout's log-probs are kept (`calculate_log_probs`), so every step logs the rollout/trainer
# drift (`training/rollout_probs_diff_*`): a policy that collapses can be told from a weight sync that broke.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SIZE=${SIZE:-0.5b}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-/tmp/gpu_learn}
SFT_STEPS=${SFT_STEPS:-300}
SFT_LR=${SFT_LR:-5e-4}
GRPO_STEPS=${GRPO_STEPS:-12}
GRPO_LR=${GRPO_LR:-1e-5}  # 3e-5 collapsed at step 6 (README.md)
TEST_FREQ=${TEST_FREQ:-3}
PROMPTS=${PROMPTS:-64}
DIGITS=${DIGITS:-5}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=offline
export HF_HUB_DISABLE_PROGRESS_BARS=1
TOOLS="$PWD/examples/multiturn/config/tool_config/calculator_tool_config.yaml"
MODEL=$WORK/model DATA=$WORK/data SFT_DIR=$WORK/sft RUN_DIR=$WORK/grpo
mkdir -p "$WORK"
log() { echo "[gpu_learn $(date +%H:%M:%S)] $*"; }
if [ "$SIZE" = 0.5b ]; then
  SHAPE=(--hidden_size 896 --num_layers 24 --num_heads 14 --num_kv_heads 2 --intermediate_size 4864)
  GPUS=1 MICRO=32 GEN=(actor_rollout_ref.rollout.gpu_memory_utilization=0.4)
else  # the quickstart's tiny shape, for a CPU check of the stages
  SHAPE=() GPUS=2 MICRO=16 GEN=(ray_init.num_cpus=2)
fi
start=$SECONDS

log "data: $DIGITS-digit x $DIGITS-digit products, the teacher calls the calculator 30% of the time"
python examples/data_preprocess/calculator.py --local_dir "$DATA" --tools_config "$TOOLS" --train_size 20000 \
    --test_size 128 --num_digits "$DIGITS" --b_digits "$DIGITS" --full_width --tool_rate 0.3 --copy_all --seed 0
log "model: $SIZE architecture, random weights"
python scripts/make_tiny_model.py --out_dir "$MODEL" --corpus_file "$DATA/corpus.txt" --vocab_size 1024 --seed 0 \
    "${SHAPE[@]}"
python - "$MODEL" <<'EOF'
import math, sys
from pathlib import Path
from safetensors import safe_open
n = 0
for f in Path(sys.argv[1]).glob("*.safetensors"):
    with safe_open(str(f), "pt") as st:
        n += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
print(f"[gpu_learn] parameters: {n / 1e6:.1f} M")
EOF

sft_start=$SECONDS
log "SFT: $SFT_STEPS steps of 64 transcripts, lr $SFT_LR (cosine, 10% warm-up)"
python -m rlpost.trainer.fsdp_sft_trainer \
    data.train_files="$DATA/sft_train.parquet" data.val_files=null \
    data.prompt_key=prompt data.response_key=response data.tools_key=tools data.max_length=256 \
    data.train_batch_size=64 data.micro_batch_size_per_gpu="$MICRO" \
    model.partial_pretrain="$MODEL" optim.lr="$SFT_LR" \
    trainer.total_training_steps="$SFT_STEPS" trainer.default_local_dir="$SFT_DIR" \
    trainer.device="$DEVICE" trainer.n_gpus_per_node=1 trainer.seed=1 trainer.logger='[file]'
SFT_S=$((SECONDS - sft_start))
log "SFT wall time: $SFT_S s"

grpo_start=$SECONDS
log "GRPO with tool_agent: $GRPO_STEPS steps of $PROMPTS prompts x 8, lr $GRPO_LR, validation every $TEST_FREQ"
rm -rf "$RUN_DIR"
python -m rlpost.trainer.main_ppo --config-path="$PWD/examples/quickstart" --config-name=grpo_calculator \
    data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
    data.train_batch_size="$PROMPTS" data.max_response_length=112 \
    actor_rollout_ref.model.path="$SFT_DIR/global_step_$SFT_STEPS" \
    actor_rollout_ref.actor.optim.lr="$GRPO_LR" actor_rollout_ref.actor.ppo_mini_batch_size="$PROMPTS" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO" \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOLS" \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    trainer.device="$DEVICE" trainer.n_gpus_per_node="$GPUS" \
    trainer.total_training_steps="$GRPO_STEPS" trainer.test_freq="$TEST_FREQ" \
    trainer.default_local_dir="$RUN_DIR" trainer.experiment_name="gpu_learn_$SIZE" "${GEN[@]}" "$@"
GRPO_S=$((SECONDS - grpo_start))
python scripts/quickstart_eval.py "$RUN_DIR" --tool_calls
log "wall time: SFT $SFT_S s, GRPO $GRPO_S s, all $((SECONDS - start)) s"
