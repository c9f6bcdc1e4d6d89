#!/usr/bin/env bash
# The TASK=distill stage list of scripts/quickstart.sh (sourced by it: uses its ROOT, WORK, MODEL, DATA, SFT_DIR,
# SFT_STEPS, GRPO_STEPS, RUN_DIR and its functions log, sft and rl).
#
# 1. the times-ten task twice from one tiny model: a teacher SFT'd on correct demonstrations, a student SFT'd
#    on the imperfect teacher's (70% forget the zero): step DISTILL_STUDENT_SFT_STEPS of a DISTILL_STUDENT_SFT_RUN-step run
# 2. the teacher's greedy held-out accuracy (main_ppo with trainer.val_only=true)
# 3. on-policy distillation through main_ppo: the student samples, the teacher (beside the actor) returns its
#    log-probs over the union of the student's and its own top-16 at every sampled position, and the actor's loss
#    is KL(teacher || student) over that support (forward_kl_topk; no task reward)
# 4. GRPO alone from the same student, same data, batch and step budget
# 5. prints `teacher: X`, `student after distillation: Y (step S)`, `student after GRPO alone: Z (step S)` and
#    plots both held-out curves (scripts/quickstart_distill_report.py)
#
# DISTILL_SMOKE=1 (the CI smoke): teacher SFT 2 steps, student SFT 1 step, then the distillation run alone (1 RL
# step, 16 held-out questions); the teacher's evaluation, GRPO alone and the report are skipped (the report is
# tested on hand-written metrics). Extra arguments go to the distillation run's main_ppo.
SMOKE=${DISTILL_SMOKE:-0}
if [ "$SMOKE" = 1 ]; then SMOKE_DEFAULTS=(2 1 1 1 1 16); else SMOKE_DEFAULTS=("$SFT_STEPS" 50 100 20 1 200); fi
TEACHER_SFT_STEPS=${DISTILL_TEACHER_SFT_STEPS:-${SMOKE_DEFAULTS[0]}}
# The student is the step-STUDENT_SFT_STEPS checkpoint of a STUDENT_SFT_RUN-step SFT run (its cosine schedule
# has not decayed yet): it copies the digits greedily but forgets the zero, and ~5% of its samples are right.
STUDENT_SFT_STEPS=${DISTILL_STUDENT_SFT_STEPS:-${SMOKE_DEFAULTS[1]}}
STUDENT_SFT_RUN=${DISTILL_STUDENT_SFT_RUN:-${SMOKE_DEFAULTS[2]}}
GRPO_STEPS=${DISTILL_STEPS:-${SMOKE_DEFAULTS[3]}}  # the RL step budget of both runs
VAL_FREQ=${DISTILL_VAL_FREQ:-${SMOKE_DEFAULTS[4]}}
TEST_SIZE=${DISTILL_TEST_SIZE:-${SMOKE_DEFAULTS[5]}}  # held-out questions, validated greedily every VAL_FREQ steps
if [ "$STUDENT_SFT_STEPS" -gt "$STUDENT_SFT_RUN" ]; then
  echo "DISTILL_STUDENT_SFT_STEPS=$STUDENT_SFT_STEPS is past the student's SFT run (DISTILL_STUDENT_SFT_RUN=$STUDENT_SFT_RUN); use DISTILL_STUDENT_SFT_STEPS <= $STUDENT_SFT_RUN" >&2
  exit 2
fi
LR=${DISTILL_LR:-1e-3}                  # the actor's learning rate in both runs

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
# The smoke's two SFT launches overlap (start-up is most of their time); the demo's run one after the other (two
# OMP_NUM_THREADS=2 processes on 2 cores would slow each other's matmuls).
TEACHER_SFT_PID=
if [ "$SMOKE" = 1 ]; then
  # two SFT processes at once: each picks a free rendezvous port of its own (an exported MASTER_PORT would be shared)
  (unset MASTER_PORT; sft "correct demonstrations (the teacher)" data.max_length=48 trainer.logger='[file]') &
  TEACHER_SFT_PID=$!
else
  sft "correct demonstrations (the teacher)" data.max_length=48 trainer.logger='[file]'
fi
TEACHER=$SFT_MODEL
DATA=$WORK/data_slip0.7 SFT_DIR=$WORK/sft_student SFT_STEPS=$STUDENT_SFT_RUN
SFT_MODEL=$SFT_DIR/global_step_$STUDENT_SFT_STEPS
sft "demonstrations from the imperfect teacher (the student: its step-$STUDENT_SFT_STEPS checkpoint)" \
    data.max_length=48 trainer.logger='[file]' trainer.save_freq="$STUDENT_SFT_STEPS"
if [ -n "$TEACHER_SFT_PID" ]; then wait "$TEACHER_SFT_PID"; fi

RUN_DIR=$WORK/teacher_eval
if [ "$SMOKE" != 1 ] && [ ! -f "$RUN_DIR/metrics.jsonl" ]; then
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
if [ "$SMOKE" = 1 ]; then
  log "smoke run: the teacher's evaluation, GRPO alone and the report skipped"
  return 0
fi
RUN_DIR=$WORK/grpo
rl grpo "GRPO alone: $GRPO_STEPS steps from the same student" trainer.test_freq="$VAL_FREQ" \
    trainer.experiment_name=grpo_alone actor_rollout_ref.actor.optim.lr="$LR" "$@"
python scripts/quickstart_distill_report.py --teacher "$WORK/teacher_eval" --distill "$WORK/distill" \
    --grpo "$WORK/grpo" --plot "${DISTILL_PLOT:-$WORK/distill_vs_grpo.png}"
