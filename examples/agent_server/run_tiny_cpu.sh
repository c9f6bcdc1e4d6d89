#!/usr/bin/env bash
# GRPO through an agent that knows nothing of rlpost: every row runs examples/agent_server/agent.py, an unmodified
# `openai`-client program, against the OpenAI-compatible endpoint the rollout worker serves during generation
# (rlpost.agent.openai_server). The endpoint records each call's exact token ids and log-probs; the row's
# trajectory is the model's turns (response_mask 1) with the agent's own follow-up text between them (mask 0); the
# agent prints its own {"reward": x}. Tiny random Qwen2 model, arithmetic prompts, 2 CPU worker processes, 2 steps.
#
#   bash examples/agent_server/run_tiny_cpu.sh
#   bash examples/agent_server/run_tiny_cpu.sh trainer.total_training_steps=4   # any override, last wins
#
# Each step logs multi_turn/program/{ok,crashed,timeout,no_model_call,no_reward} (rows of each outcome).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
tiny_cpu_setup agent_server_tiny_cpu
mkdir -p "$CKPT_DIR"
# The agent-loop YAML names the program by absolute paths: the rollout workers do not run in this folder.
AGENT_LOOPS="$CKPT_DIR/agent_loops.yaml"
cat > "$AGENT_LOOPS" <<YAML
- name: openai_client_agent
  _target_: rlpost.agent.external.ExternalAgentLoop
  command: ["$(command -v python3)", "$REPO_ROOT/examples/agent_server/agent.py"]
  timeout_s: 120
  reward: program
YAML

python3 -m rlpost.trainer.main_ppo "${COMMON[@]}" \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=4 \
    data.max_response_length=96 \
    data.return_raw_chat=true \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENT_LOOPS" \
    actor_rollout_ref.rollout.agent.default_agent_loop=openai_client_agent \
    trainer.rollout_data_dir="$CKPT_DIR/rollouts" \
    "$@"
