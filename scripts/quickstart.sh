#!/usr/bin/env bash
# The quickstart: RL fixes what imitation learned wrong, on 2 CPU cores, in a few minutes.
#
#   bash scripts/quickstart.sh                 # everything below, from a fresh clone
#   ALGO=ppo bash scripts/quickstart.sh        # PPO with a critic (GAE) instead of GRPO
#   LORA_RANK=16 bash scripts/quickstart.sh    # train LoRA adapters (PEFT) instead of the full model
#   QUICKSTART_DIR=/tmp/qs bash scripts/quickstart.sh
#   TASK=calculator bash scripts/quickstart.sh # multi-turn: GRPO teaches the model to use a calculator tool
#   TASK=code bash scripts/quickstart.sh       # code RL: programs scored on hidden tests in rlpost's sandbox
#   TASK=vision bash scripts/quickstart.sh     # vision-language RL: a tiny Qwen2-VL model learns to read colours
#   TASK=distill bash scripts/quickstart.sh    # on-policy distillation from an SFT'd teacher vs GRPO alone
#
# 1. set up .venv (scripts/setup_env.sh)
# 2. build a tiny Qwen2-architecture model and its tokenizer (random weights, offline)
# 3. write the task ("What is 4712 * 10?" -> "#### 47120"); held-out numbers never seen in training.
#    The SFT demonstrations come from an imperfect teacher that forgets the zero 70% of the time.
# 4. SFT: the model learns both answers, and greedy decoding gives the teacher's usual, wrong one
# 5. GRPO with the vLLM CPU engine in 2 worker processes; the reward is the exact product
# 6. print `held-out accuracy: before=<x.xx> after=<y.yy>` (greedy, the last line)
# See docs/quickstart.md for what each step does and the measured numbers.
#
# TASK=calculator: "What is 4712 * 8391?" (an 8-digit product the tiny model cannot compute); the SFT teacher
# calls the calculator tool on 30% of the questions and otherwise guesses a nearby number; GRPO with `tool_agent`
# (multi-turn rollouts, the tool's result masked out of the loss) on the exact-product reward. Prints the
# accuracy line, then `tool-call rate: before=<x.xx> after=<y.yy>` (greedy). See docs/multiturn.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TASK=${TASK:-times_ten}                 # times_ten, calculator (multi-turn, with a tool), code (the sandbox), vision, distill
case "$TASK" in
  times_ten) WORK=${QUICKSTART_DIR:-/tmp/rlpost_quickstart}; SFT_STEPS=${SFT_STEPS:-100} ;;
  calculator) WORK=${QUICKSTART_DIR:-/tmp/rlpost_quickstart_calculator}; SFT_STEPS=${SFT_STEPS:-300} ;;
  code) WORK=${QUICKSTART_DIR:-/tmp/rlpost_quickstart_code}; SFT_STEPS=${SFT_STEPS:-200}; GRPO_STEPS=${GRPO_STEPS:-12} ;;
  vision) WORK=${QUICKSTART_DIR:-/tmp/rlpost_quickstart_vision}; SFT_STEPS=${SFT_STEPS:-100}; GRPO_STEPS=${GRPO_STEPS:-100} ;;
  distill) WORK=${QUICKSTART_DIR:-/tmp/rlpost_quickstart_distill}; SFT_STEPS=${SFT_STEPS:-100} ;;
  *) echo "TASK=$TASK: not a quickstart task; use TASK=times_ten (the default), TASK=calculator, TASK=code, TASK=vision or TASK=distill" >&2
     exit 2 ;;
esac
if [ "$TASK" != times_ten ] && { [ "${ALGO:-grpo}" != grpo ] || [ "${LORA_RANK:-0}" -gt 0 ]; }; then
  echo "TASK=$TASK: not supported yet with ALGO=${ALGO:-grpo} LORA_RANK=${LORA_RANK:-0}; use ALGO=grpo LORA_RANK=0" >&2
  exit 2
fi
if [ -z "${QUICKSTART_SKIP_SETUP:-}" ]; then  # tests run inside an environment already set up
  # shellcheck disable=SC1091
  source "$ROOT/scripts/setup_env.sh"
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# transformers' bars for loading / writing the 26 tensors of a tiny model are noise on this console
export HF_HUB_DISABLE_PROGRESS_BARS=${HF_HUB_DISABLE_PROGRESS_BARS:-1}
# One thread per worker process in the RL stage: two cores, and oversubscribed OpenMP threads make small
# matmuls ~5x slower. The single-process stages use both cores.

GRPO_STEPS=${GRPO_STEPS:-20}
ALGO=${ALGO:-grpo}                      # grpo, or ppo (GAE with a critic)
MODEL=$WORK/model
DATA=$WORK/data
SFT_DIR=$WORK/sft
RUN_DIR=$WORK/$ALGO
LORA_RANK=${LORA_RANK:-0}
LORA_ARGS=()
if [ "$LORA_RANK" -gt 0 ]; then  # adapters learn with a larger step than full fine-tuning
  LORA_ARGS=(actor_rollout_ref.model.lora_rank="$LORA_RANK" actor_rollout_ref.model.lora_alpha=$((2 * LORA_RANK))
             actor_rollout_ref.actor.optim.lr="${LORA_LR:-2e-3}")
  RUN_DIR=$WORK/${ALGO}_lora$LORA_RANK
fi
SFT_MODEL=$SFT_DIR/global_step_$SFT_STEPS
log() { echo "[quickstart $(date +%H:%M:%S)] $*"; }

# SFT of $MODEL on $DATA/sft_train.parquet into $SFT_MODEL, skipped when a run already wrote it.
# $1: the log line's account of the demonstrations; the rest: the task's own overrides (data keys, length, logger).
sft() {
  local demos=$1; shift
  if [ -f "$SFT_MODEL/config.json" ]; then return 0; fi
  log "SFT: $SFT_STEPS steps of 64 $demos"
  OMP_NUM_THREADS=2 python -m rlpost.trainer.fsdp_sft_trainer \
      data.train_files="$DATA/sft_train.parquet" \
      data.val_files=null \
      data.train_batch_size=64 \
      data.micro_batch_size_per_gpu=64 \
      model.partial_pretrain="$MODEL" \
      optim.lr=3e-3 \
      trainer.total_training_steps="$SFT_STEPS" \
      trainer.default_local_dir="$SFT_DIR" \
      trainer.device=cpu \
      trainer.n_gpus_per_node=1 \
      trainer.seed=1 \
      "$@"
}

# RL from $SFT_MODEL into a fresh $RUN_DIR with examples/quickstart/<$1>.yaml, greedy validation before and after.
# $2: the log line; the rest: overrides.
rl() {
  local config=$1 what=$2; shift 2
  log "$what"
  rm -rf "$RUN_DIR"
  local start=$SECONDS
  OMP_NUM_THREADS=1 python -m rlpost.trainer.main_ppo --config-path="$ROOT/examples/quickstart" --config-name="$config" \
      data.train_files="$DATA/train.parquet" \
      data.val_files="$DATA/test.parquet" \
      actor_rollout_ref.model.path="$SFT_MODEL" \
      trainer.total_training_steps="$GRPO_STEPS" \
      trainer.test_freq="$GRPO_STEPS" \
      trainer.default_local_dir="$RUN_DIR" \
      "$@"
  log "$ALGO wall time: $((SECONDS - start)) s (start-up and both validations included)"
}

if [ "$TASK" = calculator ]; then
  # shellcheck source=scripts/quickstart_calculator.sh
  source "$ROOT/scripts/quickstart_calculator.sh"
  exit 0
fi
if [ "$TASK" = distill ]; then
  # shellcheck source=scripts/quickstart_distill.sh
  source "$ROOT/scripts/quickstart_distill.sh"
  exit 0
fi
if [ "$TASK" = code ]; then
  # shellcheck source=scripts/quickstart_code.sh
  source "$ROOT/scripts/quickstart_code.sh"
  exit 0
fi
if [ "$TASK" = vision ]; then
  # shellcheck source=scripts/quickstart_vision.sh
  source "$ROOT/scripts/quickstart_vision.sh"
  exit 0
fi

if [ ! -f "$MODEL/config.json" ]; then
  log "building the tiny model in $MODEL"
  python scripts/make_tiny_model.py --out_dir "$MODEL" --seed 0
fi
if [ ! -f "$DATA/train.parquet" ]; then
  log "writing the task data to $DATA"
  python examples/data_preprocess/times_ten.py --local_dir "$DATA" --train_size 3000 --test_size 200 \
      --num_digits 4 --sft_slip 0.7 --seed 0
fi

sft "demonstrations from the imperfect teacher" data.max_length=48 trainer.logger='[console]'
rl "$ALGO" "$ALGO: $GRPO_STEPS steps, 2 CPU worker processes with vLLM; greedy validation before and after" \
    "${LORA_ARGS[@]}" "$@"
python scripts/quickstart_eval.py "$RUN_DIR"
