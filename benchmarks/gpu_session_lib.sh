# Shared by the one-GPU session scripts (benchmarks/gpu_session_e.sh, gpu_session_c3.sh); sourced, not run.
# The caller, from the repository root, sets TAG (its log prefix, e.g. gpu_session_e) and sources this with its own
# arguments. It sets DRY (1 with --dry-run), PY ($PYTHON or python3), OUT ($OUT or benchmarks: the folder above
# results/), SESSION (results/<date>_<gpu>) and SUMMARY_CMD (summary.json, INDEX.md and the current-numbers page).

DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks}
GPU=$($PY -c "from benchmarks import harness; print(harness.slug(harness.gpu_name()))")
SESSION="$OUT/results/${SESSION_NAME:-$(date -u +%F)_${GPU}}"  # SESSION_NAME: one folder for several scripts

SUMMARY_CMD=($PY -m benchmarks.session_summary "$SESSION" --results "$OUT/results")
# outside the repository's results the generated page goes beside them, not over docs/benchmarks/current.md
[[ "$OUT" != benchmarks ]] && SUMMARY_CMD+=(--page "$OUT/current.md")

part() {  # name limit command...: run under a hard limit, its output into the session's log and the console
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$SESSION/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "[$TAG] $name: rc $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$SESSION/$name.log"
    $PY -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true  # a part cut short leaves no Ray on the GPU
}

print_goals() {  # id...: each goal of $SESSION/summary.json on one line
    $PY - "$SESSION/summary.json" "$TAG" "$@" <<'PYEOF'
import json, sys
goals = json.load(open(sys.argv[1]))["goals"]
for gid in sys.argv[3:]:
    g = goals[gid]
    print(f"[{sys.argv[2]}] {gid}: value {g['value']} [{g['ci_low']}, {g['ci_high']}] target {g['target']} "
          f"met {g['met']}" + (f" ({g['reason']})" if g.get("reason") else ""))
PYEOF
}
