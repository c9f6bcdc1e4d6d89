#!/usr/bin/env bash
# Profiles for issue 48's unmet training goals (A1, A2, E1_update) on one GPU, after scripts/gpu_install.sh:
#   bash benchmarks/gpu_session_profile.sh a   # bench_phase_gap: default, no_ckpt, compile
#   bash benchmarks/gpu_session_profile.sh b   # bench_critic (profile + fp32-master side), phase_gap bf16_master, no_ckpt_2x
# Results under $OUT (the device tool's folder) or benchmarks/results/<date>_<gpu>/.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
RES=${OUT:-benchmarks/results}/profile_$(date -u +%F)
mkdir -p "$RES"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=offline
M05=${M05:-/tmp/m_0.5b}
[[ -d $M05 ]] || $PY -c "import sys; sys.path.append('benchmarks'); import bench_limits; bench_limits.build_model('$M05')"
case "${1:-a}" in
  a) timeout -k 10 ${LIMIT_A:-480} $PY -m benchmarks.bench_phase_gap --model-dir "$M05" --reps 2 \
       --variants ${VARIANTS_A:-default best compile one_unit no_ckpt_2x} --profile-variants default best \
       --out "$RES/phase_gap_a.json" 2>&1 | grep -v Warning | tail -40 ;;
  b) timeout -k 10 ${LIMIT_B1:-200} $PY -m benchmarks.bench_critic --model-dir "$M05" --prompts 64 --n 8 --rounds 4 \
       --fp32-master 0 --session "$RES" 2>&1 | grep -v Warning | tail -20
     timeout -k 10 ${LIMIT_B2:-250} $PY -m benchmarks.bench_phase_gap --model-dir "$M05" --reps 3 \
       --variants ${VARIANTS_B:-bf16_master no_ckpt_2x} --out "$RES/phase_gap_b.json" 2>&1 | tail -40 ;;
esac
