#!/usr/bin/env bash
# The TASK=distill stage list of scripts/quickstart.sh (sourced by it: uses its ROOT, WORK, MODEL, DATA, SFT_DIR,
# SFT_STEPS, GRPO_STEPS, RUN_DIR and its functions log, sft and rl).
#
# 1. the times-ten task twice from one tiny model: a teacher SFT'd on correct demonstrations, a student SFT'd
#    (weakly: DISTILL_STUDENT_SFT_STEPS steps) on the imperfect teacher's (70% forget the zero)
# 2. the teacher's greedy held-out accuracy (main_ppo with trainer.val_only=true)
# 3. on-policy distillation through main_ppo: the student samples, the teacher (beside the actor) returns its
#    log-probs over the union of the student's and its own top-16 at every sampled position, and the actor's loss
#    is KL(teacher || student) over that support (forward_kl_topk; no task reward)
# 4. GRPO alone from the same student, same data, batch and step budget
# 5. prints `teacher: X`, `student after distillation: Y (step S)`, `student after GRPO alone: Z (step S)` and
#    plots both held-out curves (scripts/quickstart_distill_report.py)
GRPO_STEPS=${DISTILL_STEPS:-8}  # the RL step budget of both runs
STUDENT_SFT_STEPS=${DISTILL_STUDENT_SFT_STEPS:-20}
TEACHER_SFT_STEPS=$SFT_STEPS
VAL_FREQ=${DISTILL_VAL_FREQ:-2}
LR=${DISTILL_LR:-1e-3}                  # the actor's learning rate in both runs
TEST_SIZE=${DISTILL_TEST_SIZE:-200}     # held-out questions, validated greedily every VAL_FREQ steps

if [ ! -f "$MODEL/config.json" ]; then
  log "building the tiny model in $MODEL"
  python scripts/make_tiny_model.py --out_dir "$MODEL" --seed 0
fi
for slip in 0.0 0.7; do  # same numbers (same seed); only the SFT answers differ
  if [ ! -f "$WORK/data_slip$slip/train.parquet" ]; then
    python examples/data_preprocess/times_ten.py --local_dir "$WORK/data_slip$slip" --train_size 3000 \
        --test_size "$TEST_SIZE" --num_digits 4 --sft_slip "$slip" --seed 0 >/dev/null
  fi
done

DATA=$WORK/data_slip0.0 SFT_DIR=$WORK/sft_teacher SFT_STEPS=$TEACHER_SFT_STEPS
SFT_MODEL=$SFT_DIR/global_step_$SFT_STEPS
sft "correct demonstrations (the teacher)" data.max_length=48 trainer.logger='[file]'
TEACHER=$SFT_MODEL
DATA=$WORK/data_slip0.7 SFT_DIR=$WORK/sft_student SFT_STEPS=$STUDENT_SFT_STEPS
SFT_MODEL=$SFT_DIR/global_step_$SFT_STEPS
sft "demonstrations from the imperfect teacher (the student)" data.max_length=48 trainer.logger='[file]'

RUN_DIR=$WORK/teacher_eval
if [ ! -f "$RUN_DIR/metrics.jsonl" ]; then
  SFT_MODEL_SAVED=$SFT_MODEL SFT_MODEL=$TEACHER
  rl grpo "teacher: greedy held-out accuracy" trainer.val_only=true trainer.experiment_name=teacher_eval
  SFT_MODEL=$SFT_MODEL_SAVED
fi
RUN_DIR=$WORK/distill
rl grpo "distillation: $GRPO_STEPS steps, the teacher beside the actor in 2 CPU worker processes" \
    trainer.test_freq="$VAL_FREQ" trainer.experiment_name=distill actor_rollout_ref.actor.optim.lr="$LR" \
    distillation.enabled=true distillation.teacher_models.teacher_model.model_path="$TEACHER" \
    distillation.distillation_loss.loss_mode=forward_kl_topk distillation.distillation_loss.topk=16 \
    distillation.distillation_loss.use_policy_gradient=false distillation.distillation_loss.use_task_rewards=false \
    "$@"
RUN_DIR=$WORK/grpo
rl grpo "GRPO alone: $GRPO_STEPS steps from the same student" trainer.test_freq="$VAL_FREQ" \
    trainer.experiment_name=grpo_alone actor_rollout_ref.actor.optim.lr="$LR" "$@"
python scripts/quickstart_distill_report.py --teacher "$WORK/teacher_eval" --distill "$WORK/distill" \
    --grpo "$WORK/grpo" --plot "${DISTILL_PLOT:-$WORK/distill_vs_grpo.png}"
