#!/usr/bin/env bash
# Goal C3 (issue 48): rlpost's GRPO step against verl 0.9.1's at its recommended settings, one GPU, the same parquet
# (64 prompts x 8, the GSM8K-shaped workload, ignore_eos with per-sample caps on both sides), each run under a hard
# time limit; then verl_c3.json (C3, the token check, both MFUs), summary.json, INDEX.md, the current page.
#
#   bash benchmarks/gpu_session_c3.sh              # GPU host, repository root; the call carries carry/verl_side
#   bash benchmarks/gpu_session_c3.sh --dry-run    # print the commands, run nothing
#
# Needs the rlpost bundle in SITE (scripts/gpu_install.sh; with PARTS set to a folder of its parts this script
# installs it when SITE lacks vLLM) and verl's side wheels in WHEELS (`python -m benchmarks.verl_side fetch --out
# carry/verl_side`: 11 wheels, 18 MB; verl's pins are installed into /tmp/verl_site by the verl part).
# Results: $OUT/results/<date>_<gpu>/ (OUT defaults to benchmarks/), one log per part beside them. Settings
# (environment, defaults in brackets):
#   RLPOST_LIMIT_S [190], VERL_LIMIT_S [360]   hard limits per run, in seconds (each run's own budget ends sooner);
#       rlpost's main_ppo starts in 70-120 s on an H200 (earlier sessions), verl's start is not known yet
#   ONLY [all]   rlpost or verl: that run alone (two device calls of one held machine: the session folder, the model
#       and the parquet stay under /tmp between them when OUT is there), then the summaries of what exists
#   TAR_TO [unset]   a folder (e.g. the device's $OUT): the session folder as one c3_session.tgz there at the end
#   STEPS [5]   steps per run (step 1 is the warm-up; steps 2..STEPS are timed)
#   M05 [/tmp/m_0.5b]  the random 0.5B-architecture model (built when missing); DATA [/tmp/c3_data] the parquet
#   SITE [/tmp/rlpost_site], PARTS [unset], WHEELS [carry/verl_side]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TAG=gpu_session_c3
# shellcheck source=benchmarks/gpu_session_lib.sh
source benchmarks/gpu_session_lib.sh "$@"  # DRY, PY, OUT, SESSION, SUMMARY_CMD, part, print_goals
RLPOST_LIMIT_S=${RLPOST_LIMIT_S:-190}
VERL_LIMIT_S=${VERL_LIMIT_S:-360}
ONLY=${ONLY:-all}
STEPS=${STEPS:-5}
M05=${M05:-/tmp/m_0.5b}
DATA=${DATA:-/tmp/c3_data}
SITE=${SITE:-/tmp/rlpost_site}
WHEELS=${WHEELS:-carry/verl_side}
if [[ -n "${PARTS:-}" && ! -d "$SITE/vllm" ]]; then
    if (( DRY )); then echo "install: bash scripts/gpu_install.sh $PARTS $SITE"; else bash scripts/gpu_install.sh "$PARTS" "$SITE" || exit 1; fi
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"  # this tree's rlpost first, in Ray's workers too
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}  # as docs/benchmarks/realistic.md's commands
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=offline
WL=(--model-dir "$M05" --prompts 64 --n 8 --cap 1024 --seed 0 --data "$DATA" --steps "$STEPS" --session "$SESSION")
MODEL_CMD=($PY -c "from benchmarks import bench_limits; bench_limits.ensure_model('$M05')")
DATA_CMD=($PY -m benchmarks.workload --prompts 64 --n 8 --cap 1024 --seed 0 --steps "$STEPS" --tokenizer "$M05"
          --out "$DATA")
RLPOST_CMD=($PY -m benchmarks.verl_c3 rlpost "${WL[@]}" --timeout $((RLPOST_LIMIT_S - 10)))
VERL_CMD=($PY -m benchmarks.verl_side run --wheels "$WHEELS" "${WL[@]}" --timeout $((VERL_LIMIT_S - 30)))
C3_CMD=($PY -m benchmarks.verl_c3 summary "${WL[@]}")

if (( DRY )); then
    echo "session: $SESSION"
    echo "model: ${MODEL_CMD[*]}"
    echo "data: ${DATA_CMD[*]}"
    echo "rlpost (limit ${RLPOST_LIMIT_S} s): ${RLPOST_CMD[*]}"
    echo "verl (limit ${VERL_LIMIT_S} s): ${VERL_CMD[*]}"
    echo "only: $ONLY"
    echo "c3: ${C3_CMD[*]}"
    echo "summary: ${SUMMARY_CMD[*]}"
    exit 0
fi

mkdir -p "$SESSION"
"${MODEL_CMD[@]}" || exit 1
[[ -f "$DATA/train.parquet" ]] || "${DATA_CMD[@]}" || exit 1
[[ "$ONLY" == verl ]] || part c3_rlpost "$RLPOST_LIMIT_S" "${RLPOST_CMD[@]}"
[[ "$ONLY" == rlpost ]] || part c3_verl "$VERL_LIMIT_S" "${VERL_CMD[@]}"
"${C3_CMD[@]}" || echo "[gpu_session_c3] verl_c3 summary failed: see $SESSION/c3_*.log"
"${SUMMARY_CMD[@]}" || echo "[gpu_session_c3] no result file in $SESSION: see the logs there"
[[ -f "$SESSION/summary.json" ]] && print_goals C3
[[ -n "${TAR_TO:-}" ]] && tar czf "$TAR_TO/c3_session.tgz" -C "$(dirname "$SESSION")" "$(basename "$SESSION")"
true
