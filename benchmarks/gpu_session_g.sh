#!/usr/bin/env bash
# Issue 48's training goals re-measured at the settings bench_phase_gap found (2026-12-03, phase_gap.json "best"),
# then A4 (generation settings); one GPU, after scripts/gpu_install.sh (+ the liger wheel):
#   bash benchmarks/gpu_session_g.sh              # results into $OUT/results/<date>_<gpu>/ (OUT: benchmarks)
#   bash benchmarks/gpu_session_g.sh --dry-run    # print the commands
# RET=<folder>: after each part the session folder is packed there as session_g.tgz (one file to bring back).
# PARTS [realistic critic gen_knobs]: the parts to run, in that order. Settings (environment): LIMIT_REAL [480], LIMIT_CRITIC [100], LIMIT_GEN [300] seconds per part (2026-12-03c on an H200: realistic spends ~150 s on its engine, worker and untimed step, then ~25 s a round; each gen_knobs engine ~70 s to start).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks}
GPU=$($PY -c "from benchmarks import harness; print(harness.slug(harness.gpu_name()))" 2>/dev/null || echo cpu)
SESSION="$OUT/results/${SESSION_NAME:-$(date -u +%F)g_${GPU}}"  # SESSION_NAME: one folder for several scripts
M05=${M05:-/tmp/m_0.5b}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=offline
A=actor_rollout_ref
# what bench_phase_gap's "best" variant runs (its --pick output): no checkpointing, compiled log-prob maths, the
# model as one FSDP unit, no reshard after forward, gradient sync once per mini-batch, 2x the token budgets
BUDGETS=(--grad-ckpt 0 --fwd-tokens 65536 --train-tokens 32768)
ACTOR=("$A.model.enable_gradient_checkpointing=false" "$A.actor.use_torch_compile=true"
       "$A.actor.fsdp_config.wrap_policy.min_num_params=1000000000000" "$A.actor.fsdp_config.reshard_after_forward=false"
       "$A.actor.fsdp_config.use_no_sync_for_gradient_accumulation=true"
       "$A.ref.fsdp_config.wrap_policy.min_num_params=1000000000000")
CRITIC=("critic.model.enable_gradient_checkpointing=false" "critic.model.fsdp_config.wrap_policy.min_num_params=1000000000000"
        "critic.model.fsdp_config.reshard_after_forward=false"
        "critic.model.fsdp_config.use_no_sync_for_gradient_accumulation=true")
REAL=($PY -m benchmarks.bench_realistic --model-dir "$M05" --rounds 12 "${BUDGETS[@]}" --session "$SESSION"
      --override "${ACTOR[@]}")
CRIT=($PY -m benchmarks.bench_critic --model-dir "$M05" --prompts 64 --n 8 --rounds 5 "${BUDGETS[@]}" --fp32-master 0
      --profile 0 --session "$SESSION" --override "${CRITIC[@]}")
GEN=($PY -m benchmarks.bench_gen_knobs --model-dir "$M05" --rounds 12 --budget-s $(( ${LIMIT_GEN:-300} - 10 ))
     --configs baseline runner_v2 --json-out "$SESSION/gen_knobs.json")
SUMMARY=($PY -m benchmarks.session_summary "$SESSION" --results "$OUT/results")
[[ "$OUT" != benchmarks ]] && SUMMARY+=(--page "$OUT/current.md")
if [[ "${1:-}" == "--dry-run" ]]; then
    printf '%s\n' "session: $SESSION" "realistic: ${REAL[*]}" "critic: ${CRIT[*]}" "gen: ${GEN[*]}" "summary: ${SUMMARY[*]}"
    exit 0
fi
mkdir -p "$SESSION"
[[ -d $M05 ]] || $PY -c "import sys; sys.path.append('benchmarks'); import bench_limits; bench_limits.build_model('$M05')"
part() {  # name limit command...
    local name=$1 limit=$2
    shift 2
    timeout -k 10 "$limit" "$@" > "$SESSION/$name.log" 2>&1
    echo "[gpu_session_g] $name: rc $? ($limit s limit)"; grep -E "^\[(realistic|critic|gen_knobs)\]" "$SESSION/$name.log" | tail -16
    $PY -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
    "${SUMMARY[@]}" > "$SESSION/summary.log" 2>&1 || true  # after each part: a session cut short keeps its goals
    [[ -n "${RET:-}" ]] && tar czf "$RET/session_g.tgz" -C "$(dirname "$SESSION")" "$(basename "$SESSION")"
}
PARTS=${PARTS:-realistic critic gen_knobs}
[[ " $PARTS " == *" realistic "* ]] && part realistic "${LIMIT_REAL:-480}" "${REAL[@]}"
[[ " $PARTS " == *" critic "* ]] && part critic "${LIMIT_CRITIC:-100}" "${CRIT[@]}"
[[ " $PARTS " == *" gen_knobs "* ]] && part gen_knobs "${LIMIT_GEN:-300}" "${GEN[@]}"
tail -3 "$SESSION/summary.log"
