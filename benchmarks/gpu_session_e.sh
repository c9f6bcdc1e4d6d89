#!/usr/bin/env bash
# Goals E1 (PPO critic against bare value-head loops) and E2 (7B-architecture LoRA step against the sum of its LoRA
# limits) on one GPU, each part under a hard time limit; then summary.json, INDEX.md and docs/benchmarks/current.md.
#
#   bash benchmarks/gpu_session_e.sh              # GPU host, from the repository root, after scripts/gpu_install.sh
#   bash benchmarks/gpu_session_e.sh --dry-run    # print the commands, run nothing
#
# Results: $OUT/results/<date>_<gpu>/ (OUT defaults to benchmarks/: the repository's results folder), one log per
# part beside them. Settings (environment, defaults in brackets):
#   E1_LIMIT_S [180], E2_LIMIT_S [240]   hard limits per part, in seconds (the part's own budget a little less)
#   E1_ARGS ["--prompts 64 --n 8 --rounds 8"]     benchmarks/bench_critic.py's workload and rounds (each
#       round rewrites critic.json from 2 rounds on: a part cut short keeps the rounds it finished)
#   E2_ARGS ["--prompts 8 --steps 3 --token-budgets 1 --response-len 128 --enforce-eager 1"]   bench_lora.py:
#       a reduced batch (8 prompts x 8, 128-token responses, vLLM eager, 2 measured steps) to fit E2_LIMIT_S with
#       the 7B model's build (~15 GB written), the limits' process and main_ppo's start-up. The run micro-batches
#       as the limits do (--token-budgets 1: packed rows of up to 16384 / 32768 tokens, the fused head; the 7B
#       model one FSDP unit per decoder layer) and hands vLLM the adapter in memory. With more time give
#       E2_LIMIT_S=420 E2_ARGS="--prompts 16 --steps 4 --token-budgets 1 --response-len 512 --enforce-eager 0"
#   M05 [/tmp/m_0.5b], M7 [/tmp/model_7b]   model folders (random weights, built when missing)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TAG=gpu_session_e
# shellcheck source=benchmarks/gpu_session_lib.sh
source benchmarks/gpu_session_lib.sh "$@"  # DRY, PY, OUT, SESSION, SUMMARY_CMD, part, print_goals
E1_LIMIT_S=${E1_LIMIT_S:-180}
E2_LIMIT_S=${E2_LIMIT_S:-240}
E1_ARGS=${E1_ARGS:---prompts 64 --n 8 --rounds 8}
E2_ARGS=${E2_ARGS:---prompts 8 --steps 3 --token-budgets 1 --response-len 128 --enforce-eager 1}
M05=${M05:-/tmp/m_0.5b}
M7=${M7:-/tmp/model_7b}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this tree's rlpost, in Ray's workers too
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}  # as docs/benchmarks/realistic.md's commands
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=offline
# shellcheck disable=SC2206  # the *_ARGS are word lists on purpose
E1_CMD=($PY -m benchmarks.bench_critic --model-dir "$M05" $E1_ARGS --session "$SESSION")
# bench_lora's own budget (its runs are killed with their process groups and Ray) ends before the hard limit
# shellcheck disable=SC2206
E2_CMD=($PY benchmarks/bench_lora.py --arch 7b --modes lora_adapter --limits --model-dir "$M7" $E2_ARGS
        --timeout $((E2_LIMIT_S - 15)) --limits-timeout $((E2_LIMIT_S * 11 / 24)) --out "$SESSION/lora_7b.json")

if (( DRY )); then
    echo "session: $SESSION"
    echo "E1 (limit ${E1_LIMIT_S} s): ${E1_CMD[*]}"
    echo "E2 (limit ${E2_LIMIT_S} s): ${E2_CMD[*]}"
    "${E2_CMD[@]}" --dry-run | sed 's/^/    /'
    echo "summary: ${SUMMARY_CMD[*]}"
    exit 0
fi

mkdir -p "$SESSION"
part e1_critic "$E1_LIMIT_S" "${E1_CMD[@]}"
part e2_lora_7b "$E2_LIMIT_S" "${E2_CMD[@]}"
"${SUMMARY_CMD[@]}" || { echo "[gpu_session_e] no result file in $SESSION: see the logs there"; exit 1; }
print_goals E1 E1_update E2
