#!/usr/bin/env bash
# GRPO through the GPU example script on a random-weight Qwen2.5-0.5B-architecture model and the times-ten
# data: 64 prompts x 8, 512 + 512 tokens (ignore_eos), 5 steps; the per-step metrics land in OUT_DIR.
#
#   bash scripts/gpu_grpo_e2e.sh NGPUS TP NAME [OUT_DIR] [key=value ...]    (docs/benchmarks/main_ppo.md)
set -uo pipefail
ngpu=${1:?usage: gpu_grpo_e2e.sh NGPUS TP NAME [OUT_DIR] [key=value ...]} tp=${2:?TP} name=${3:?NAME}
out=${4:-benchmarks/results}; shift $(( $# < 4 ? $# : 4 ))
mkdir -p "$out"
[[ -d /tmp/m ]] || python3 benchmarks/bench_limits.py --save-model /tmp/m > /dev/null || exit 1
[[ -d /tmp/d ]] || python3 examples/data_preprocess/times_ten.py --local_dir /tmp/d > /dev/null || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start=$(date +%s)
MODEL_PATH=/tmp/m DATA_DIR=/tmp/d N_GPUS=$ngpu timeout 400 bash examples/grpo_trainer/run_qwen2_5_0_5b_gpu.sh \
    data.train_batch_size=64 data.max_response_length=512 data.val_files=null \
    actor_rollout_ref.rollout.ignore_eos=true actor_rollout_ref.rollout.tensor_model_parallel_size="$tp" \
    trainer.total_training_steps=5 trainer.test_freq=-1 trainer.save_freq=-1 trainer.val_before_train=false \
    trainer.experiment_name="$name" trainer.default_local_dir=/tmp/run_"$name" "$@" > "$out/$name.log" 2>&1
rc=$?
echo "$name rc=$rc wall=$(( $(date +%s) - start ))s"
cp /tmp/run_"$name"/metrics.jsonl "$out/grpo_e2e_$name.jsonl" 2>/dev/null
python3 - "$out/grpo_e2e_$name.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except OSError:
    sys.exit("no metrics.jsonl: see the log")
for r in rows:
    print({k: round(v, 3) for k, v in r.items() if isinstance(v, (int, float)) and
           (k.startswith("timing_s/") or k in ("step", "perf/throughput", "perf/max_memory_allocated_gb"))})
PY
exit $rc
