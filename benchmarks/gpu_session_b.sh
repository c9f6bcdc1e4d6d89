#!/usr/bin/env bash
# Issue 49 on a host of several H200s, one device call per `--call`, each part under a hard time limit; after each
# call, summary.json (every issue-49 goal id: `session_summary --goals 49`), INDEX.md and the current page.
#
#   bash benchmarks/gpu_session_b.sh --call b1a            # one device call (<= ~550 s), from the repository root
#   bash benchmarks/gpu_session_b.sh --dry-run             # print every call's commands, run nothing
#   bash benchmarks/gpu_session_b.sh --dry-run --call d1   # print one call's
#   bash benchmarks/gpu_session_b.sh --part b_step2        # one part alone (re-running one cut short)
#
# Calls (run in this order; b1a and b1b on the same nvidia-h200-x4 machine, so the limits bracket both 7B runs;
# d1 and d3 need 2 GPUs and 1 GPU: nvidia-h200-x2 is enough):
#   b1a  b_model (7B random weights, if missing), b_limits_before, b_step4 (7B main_ppo, 4 GPUs)   B1-B4, B6
#   b1b  b_model (if missing), b_step2 (7B main_ppo, 2 GPUs, same prompts per GPU), b_limits_after     B1, B5
#   b1c  b_model (if missing), b_step4_real (7B main_ppo, 4 GPUs, the long-tailed workload)           B6_realistic
#   d1   d1_ulysses (SP1 / SP2 at 16k and 32k, 2 GPUs), nosync_on, nosync_off (0.5B, 2 FSDP ranks)  D1, NOSYNC
#   d3   d3_sglang (SGLang bare against in the loop, alternated rounds, 1 GPU)                         D3
#   d2a  d2_sync_hybrid (7B, hybrid on 4 GPUs, long-tailed responses up to 4k, 6 steps)              D2
#   d2b  d2_one_step_off (the same, 2 trainer + 2 rollout GPUs, one step off)                          D2
#   d2c  d2_fully_async (the same split, separate_async with partial rollouts)                         D2
#   t1v  t1_vllm (multi-turn agent loops at rollout TP 2 on vLLM: TP-2 / TP-1 check, main_ppo 2 steps; 2 GPUs) T1
#   t1s  t1_sglang (the same on SGLang: the SGLang bundle on PYTHONPATH, as for d3; 2 GPUs)                   T1
#   m1a  m_model (Qwen3-30B-A3B shape, MOE_LAYERS of its 48 layers, random weights), m1_off (main_ppo, 4 GPUs,
#        router replay off)                                                                           M1
#   m1b  m_model (if missing), m1_r2 (the same with router replay R2)                                  M1
#
# Results: $OUT/results/<date>_<gpu>/ (OUT defaults to benchmarks/), one log per part beside them. Settings
# (environment, defaults in brackets): *_LIMIT_S, hard limits per part in seconds (a main_ppo run's own
# --timeout is 15 s less); M7 [/tmp/m_7b] the 7B model folder (bench_scale reads /tmp/m_<arch>);
# MEM7 [0.35] the 7B engine's share of each GPU, the same at 2 and 4 GPUs (at 2 the actor's shards and AdamW
# state take ~61 GB per GPU, beside the engine's share).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DRY=0
CALL=all
ONLY=
while (( $# )); do
    case $1 in
        --dry-run) DRY=1 ;;
        --call) CALL=${2:?--call needs one of b1a b1b b1c d1 d2a d2b d2c d3 t1v t1s m1a m1b}; shift ;;
        --part) ONLY=${2:?--part needs a part name}; shift ;;
        *) echo "gpu_session_b.sh: unknown argument $1 (give --call b1a|b1b|b1c|d1|d2a|d2b|d2c|d3|t1v|t1s|m1a|m1b, --part NAME, --dry-run)" >&2
           exit 2 ;;
    esac
    shift
done
case $CALL in b1a|b1b|b1c|d1|d2a|d2b|d2c|d3|t1v|t1s|m1a|m1b) ;; all) (( DRY )) || [[ -n $ONLY ]] || {
    echo "gpu_session_b.sh: give --call b1a|b1b|b1c|d1|d2a|d2b|d2c|d3|t1v|t1s|m1a|m1b or --part NAME" >&2; exit 2; } ;;
    *) echo "gpu_session_b.sh: --call $CALL: give one of b1a b1b b1c d1 d2a d2b d2c d3 t1v t1s m1a m1b" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks}
GPU=$($PY -c "from benchmarks import harness; print(harness.slug(harness.gpu_name()))")
SESSION="$OUT/results/$(date -u +%F)_${GPU}"
M7=${M7:-/tmp/m_7b}
MEM7=${MEM7:-0.35}
MODEL_LIMIT_S=${MODEL_LIMIT_S:-100}
LIMITS_LIMIT_S=${LIMITS_LIMIT_S:-200}
STEP_LIMIT_S=${STEP_LIMIT_S:-250}
ULYSSES_LIMIT_S=${ULYSSES_LIMIT_S:-220}
NOSYNC_LIMIT_S=${NOSYNC_LIMIT_S:-160}
SGLANG_LIMIT_S=${SGLANG_LIMIT_S:-480}
T1_LIMIT_S=${T1_LIMIT_S:-540}
D2_LIMIT_S=${D2_LIMIT_S:-540}
MOE_LIMIT_S=${MOE_LIMIT_S:-390}
MOE_MODEL_LIMIT_S=${MOE_MODEL_LIMIT_S:-160}
MOE_LAYERS=${MOE_LAYERS:-24}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this tree's rlpost, in Ray's workers too
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}  # as docs/benchmarks/realistic.md's commands
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=offline

ARR=actor_rollout_ref
# 7B: one GPU's share of the 4-GPU batch (8 prompts x 8, 28 + 512 tokens), as docs/benchmarks/scale.md's 7B run
LIMITS7=($PY benchmarks/bench_limits.py --arch 7b --prompts 8 --n 8 --prompt-len 28 --fwd-micro 16 --train-micro 8
         --mini-prompts 8 --gen-reps 5 --model-dir "$M7")
MICRO7=("$ARR.actor.ppo_micro_batch_size_per_gpu=8" "$ARR.rollout.log_prob_micro_batch_size_per_gpu=16"
        "$ARR.ref.log_prob_micro_batch_size_per_gpu=16" "$ARR.rollout.gpu_memory_utilization=$MEM7")
STEP7=($PY benchmarks/bench_scale.py --arch 7b --tps 1 --prompts-per-gpu 8 --steps 5 --timeout $((STEP_LIMIT_S - 15)))
NOSYNC=($PY benchmarks/bench_scale.py --arch 0.5b --gpus 2 --prompts 128 --response-len 256 --steps 4
        --timeout $((NOSYNC_LIMIT_S - 15)))
NOSYNC_OV=("$ARR.actor.ppo_micro_batch_size_per_gpu=8")  # 64 micro-batches per optimizer step on each rank
declare -A CMD LIMIT
CMD[b_model]="$PY benchmarks/bench_limits.py --arch 7b --save-model $M7"; LIMIT[b_model]=$MODEL_LIMIT_S
CMD[b_limits_before]="${LIMITS7[*]} --json-out $SESSION/limits_7b_before.json"; LIMIT[b_limits_before]=$LIMITS_LIMIT_S
CMD[b_limits_after]="${LIMITS7[*]} --json-out $SESSION/limits_7b_after.json"; LIMIT[b_limits_after]=$LIMITS_LIMIT_S
CMD[b_step4]="${STEP7[*]} --gpus 4 --override ${MICRO7[*]} --json-out $SESSION/scale_7b_4gpu.json --log-dir $SESSION"
CMD[b_step2]="${STEP7[*]} --gpus 2 --override ${MICRO7[*]} --json-out $SESSION/scale_7b_2gpu.json --log-dir $SESSION"
CMD[b_step4_real]="${STEP7[*]} --gpus 4 --workload realistic --timeout $((STEP_LIMIT_S + 135)) --override ${MICRO7[*]} --json-out $SESSION/scale_7b_4gpu_realistic.json --log-dir $SESSION"
LIMIT[b_step4]=$STEP_LIMIT_S; LIMIT[b_step2]=$STEP_LIMIT_S; LIMIT[b_step4_real]=$((STEP_LIMIT_S + 150))
CMD[d1_ulysses]="$PY benchmarks/bench_ulysses.py --lengths 16384 32768 --reps 5 --json-out $SESSION/ulysses.json"
LIMIT[d1_ulysses]=$ULYSSES_LIMIT_S
for side in on off; do
    flag=$([[ $side == on ]] && echo true || echo false)
    CMD[nosync_$side]="${NOSYNC[*]} --override ${NOSYNC_OV[*]} $ARR.actor.fsdp_config.use_no_sync_for_gradient_accumulation=$flag --json-out $SESSION/scale_nosync_$side.json --log-dir $SESSION/nosync_$side"
    LIMIT[nosync_$side]=$NOSYNC_LIMIT_S
done
CMD[d3_sglang]="$PY benchmarks/bench_sglang.py --modes sglang:bare sglang:loop --prompts 64 --rounds 2 --reps 3 --out-dir $SESSION"
LIMIT[d3_sglang]=$SGLANG_LIMIT_S
# D2: one configuration per call, the same model, workload and steps (each run killed 20 s before its part)
# (the hybrid engine shares each GPU with the actor: MEM7; a rollout GPU of the split is the engine's: 0.8)
D2_MICRO=("${MICRO7[@]:0:3}")
for config in sync_hybrid one_step_off fully_async; do
    mem=$([[ $config == sync_hybrid ]] && echo "$MEM7" || echo 0.8)
    CMD[d2_$config]="$PY benchmarks/bench_async_d2.py --config $config --arch 7b --side-gpus 2 --prompts 32 --n 8 --cap 4096 --steps 6 --timeout $((D2_LIMIT_S - 20)) --override ${D2_MICRO[*]} $ARR.rollout.gpu_memory_utilization=$mem --out-dir $SESSION"
    LIMIT[d2_$config]=$D2_LIMIT_S
done
# T1: three runs per engine (TP-2 check, TP-1 check, main_ppo), each killed after a third of the part's limit
for engine in vllm sglang; do
    CMD[t1_$engine]="$PY benchmarks/bench_multiturn_tp.py --device cuda --engines $engine --steps 2 --part-timeout $(((T1_LIMIT_S - 60) / 3)) --out-dir $SESSION"
    LIMIT[t1_$engine]=$T1_LIMIT_S
done
# M1: the MoE shape at MOE_LAYERS layers (24: 15.3B parameters, FSDP's fp32 state ~61 GB per GPU on 4), one
# replay setting per call, the same model, workload and steps
MOE=($PY benchmarks/bench_moe.py --gpus 4 --layers "$MOE_LAYERS" --prompts 64 --n 8 --cap 1024 --steps 4)
CMD[m_model]="${MOE[*]} --replay off --build-only --out-dir $SESSION"; LIMIT[m_model]=$MOE_MODEL_LIMIT_S
for replay in off r2; do
    CMD[m1_$replay]="${MOE[*]} --replay $replay --timeout $((MOE_LIMIT_S - 20)) --override $ARR.rollout.gpu_memory_utilization=$MEM7 --out-dir $SESSION"
    LIMIT[m1_$replay]=$MOE_LIMIT_S
done
declare -A PARTS=([b1a]="b_model b_limits_before b_step4" [b1b]="b_model b_step2 b_limits_after"
                  [b1c]="b_model b_step4_real"
                  [d1]="d1_ulysses nosync_on nosync_off" [d3]="d3_sglang" [t1v]="t1_vllm" [t1s]="t1_sglang"
                  [d2a]="d2_sync_hybrid" [d2b]="d2_one_step_off" [d2c]="d2_fully_async"
                  [m1a]="m_model m1_off" [m1b]="m_model m1_r2")
# goals no benchmark can produce yet, with why (the reasons summary.json files too)
NOT_BUILT="from benchmarks import goals_49
for gid, why in goals_49.NOT_BUILT.items(): print(f'{gid}: {why}')"
SUMMARY="$PY -m benchmarks.session_summary $SESSION --goals 49 --results $OUT/results"
# outside the repository's results the generated page goes beside them, not over docs/benchmarks/current.md
[[ "$OUT" != benchmarks ]] && SUMMARY+=" --page $OUT/current.md"

calls=$([[ $CALL == all ]] && echo "b1a b1b b1c d1 d2a d2b d2c d3 t1v t1s m1a m1b" || echo "$CALL")
if [[ -n $ONLY ]]; then  # one part alone (a re-run of one cut short), as a call of its own
    [[ -n ${CMD[$ONLY]:-} ]] || { echo "gpu_session_b.sh: --part $ONLY: give one of ${!CMD[*]}" >&2; exit 2; }
    PARTS[only]=$ONLY
    CALL=only calls=only
fi
if (( DRY )); then
    echo "session: $SESSION"
    for call in $calls; do
        total=0
        for p in ${PARTS[$call]}; do total=$((total + LIMIT[$p])); done
        echo "call $call (limits sum ${total} s)"
        for p in ${PARTS[$call]}; do echo "$p (limit ${LIMIT[$p]} s): ${CMD[$p]}"; done
    done
    $PY -c "$NOT_BUILT"
    echo "summary: $SUMMARY"
    exit 0
fi

mkdir -p "$SESSION"
part() {  # name: run CMD[name] under LIMIT[name], its output into the session's log and the console
    local name=$1 start=$SECONDS
    local -a argv
    read -ra argv <<< "${CMD[$name]}"
    timeout -k 10 "${LIMIT[$name]}" "${argv[@]}" 2>&1 | tee "$SESSION/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "[gpu_session_b] $name: rc $rc after $((SECONDS - start)) s (limit ${LIMIT[$name]} s)" | tee -a "$SESSION/$name.log"
    $PY -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true  # a part cut short leaves no Ray on the GPUs
}
for p in ${PARTS[$CALL]}; do
    if [[ $p == b_model && -f "$M7/config.json" ]]; then
        echo "[gpu_session_b] b_model: $M7 exists"
        continue
    fi
    part "$p"
done
$PY -c "$NOT_BUILT" | sed 's/^/[gpu_session_b] /'
$SUMMARY || { echo "[gpu_session_b] summary failed: see the logs in $SESSION"; exit 1; }
$PY - "$SESSION/summary.json" <<'EOF'
import json, sys

from benchmarks import goals_49

goals = json.load(open(sys.argv[1]))["goals"]
for gid in goals_49.GOALS:
    g = goals[gid]
    print(f"[gpu_session_b] {gid}: value {g['value']} [{g['ci_low']}, {g['ci_high']}] target {g['target']} "
          f"met {g['met']}" + (f" ({g['reason']})" if g.get("reason") else ""))
EOF
