"""End to end: multi-turn GRPO through `python -m rlpost.trainer.main_ppo` on CPU, 2 worker processes with the
vLLM CPU engine and `tool_agent` + the calculator tool with the GSM8K interaction; the calculator alone on split
rollout devices (one step off policy); the example agent loop written against verl's API
(examples/multiturn/calculator_agent_loop.py) on the HF engine. 3 steps each.

A random tiny model never writes a tool call, so the model is built the way the example does it
(examples/multiturn/run_tiny_cpu.sh): a tokenizer trained on the task's text, then a short SFT on transcripts
in which a teacher calls the calculator (`examples/data_preprocess/calculator.py`). Its calls are well formed
but it does not copy the numbers yet; that does not matter here: the test checks that calls are made, run,
fed back, masked out of the loss and counted.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "examples/multiturn/config/tool_config/calculator_tool_config.yaml"
OFFSET = REPO / "examples" / "reward_manager" / "offset_reward_manager.py"
INTERACTION = REPO / "examples/multiturn/config/interaction_config/gsm8k_interaction_config.yaml"
AGENT_LOOPS = REPO / "examples/multiturn/config/agent_loop_config/calculator_agent_loop.yaml"
MULTI_TURN = ["multi_turn/num_turns/mean", "multi_turn/num_turns/max", "multi_turn/tool_calls/mean",
              "multi_turn/tool_call_frac",
              "multi_turn/interaction_turns/mean", "multi_turn/tool_errors", "multi_turn/bad_tool_calls",
              "multi_turn/truncated_frac", "multi_turn/tokenization_mismatch_frac"]


def _run(*cmd: str, timeout: int = 600, env: dict | None = None) -> None:
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Data (plain and with interaction_kwargs), the tokenizer + model, and the SFT checkpoint."""
    root = tmp_path_factory.mktemp("multiturn_e2e")
    common = ["--tools_config", str(TOOLS), "--train_size", "256", "--test_size", "4"]
    _run("examples/data_preprocess/calculator.py", "--local_dir", str(root / "data"), *common)
    _run("examples/data_preprocess/calculator.py", "--local_dir", str(root / "data_gsm8k"), *common,
         "--interaction", "gsm8k")
    _run("examples/data_preprocess/calculator.py", "--local_dir", str(root / "data_verl"), *common,
         "--agent_name", "calculator_agent")
    _run("scripts/make_tiny_model.py", "--out_dir", str(root / "model"), "--corpus_file",
         str(root / "data" / "corpus.txt"), "--vocab_size", "1024")
    _run("-m", "rlpost.trainer.fsdp_sft_trainer", f"data.train_files={root / 'data' / 'sft_train.parquet'}",
         "data.val_files=null", "data.prompt_key=prompt", "data.response_key=response", "data.tools_key=tools",
         "data.max_length=256", "data.train_batch_size=64", "data.micro_batch_size_per_gpu=64",
         f"model.partial_pretrain={root / 'model'}", "optim.lr=3e-3", "trainer.total_training_steps=60",
         f"trainer.default_local_dir={root / 'sft'}", "trainer.logger=[console]", "trainer.device=cpu",
         "trainer.n_gpus_per_node=1", "trainer.seed=1")
    return {"root": root, "model": root / "sft" / "global_step_60"}


def run_main_ppo(ws, name: str, data: str, *overrides: str, env: dict | None = None) -> tuple[list[dict], list[dict]]:
    """3 GRPO steps with tool_agent; returns (metrics rows, rollout dump rows of all 3 steps)."""
    out = ws["root"] / name
    cmd = [
        "-m", "rlpost.trainer.main_ppo", "algorithm.adv_estimator=grpo",
        f"data.train_files={ws['root'] / data / 'train.parquet'}",
        f"data.val_files={ws['root'] / data / 'test.parquet'}",
        "data.train_batch_size=4", "data.max_prompt_length=200", f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=3",
        "trainer.test_freq=3", "trainer.save_freq=-1", "trainer.logger=[console]", "ray_init.num_cpus=2",
        f"trainer.default_local_dir={out}", f"trainer.rollout_data_dir={out / 'rollouts'}", *overrides,
    ]
    _run(*cmd, timeout=900, env=env)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # every step's trajectories: by the last step a policy may write only calls that do not fit the budget
    dump = [json.loads(line) for step in (1, 2, 3) for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    return rows, dump


def check(rows: list[dict]) -> list[dict]:
    train = [r for r in rows if "timing_s/step" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for row in train:
        for key in MULTI_TURN + ["actor/pg_loss", "critic/score/mean", "response_length/mean",
                                 "training/rollout_probs_diff_mean"]:
            assert key in row, f"{key} missing at step {row['step']}"
            assert isinstance(row[key], (int, float)) and math.isfinite(row[key]), (key, row[key])
    assert any(k.startswith("val-core/rlpost/arith/reward/mean@") for k in train[-1]), "validation did not run"
    assert all(0.0 <= train[-1][f"val-aux/{k}"] <= 1.0 for k in MULTI_TURN if k.endswith("_frac"))
    return train


def check_masks(dump: list[dict]) -> None:
    """Tool results are in the response (attention 1) but not among the trained tokens (response_mask 0). A
    trajectory whose tool message would not fit the response budget ends on the call (marked truncated, no tool
    response): those are skipped."""
    cut_at_call = [d["truncated"] and "<tool_response>" not in d["response"] for d in dump]
    with_tools = [d for d, cut in zip(dump, cut_at_call) if d["tool_calls"] > 0 and not cut]
    assert with_tools, dump
    for d in with_tools:
        assert "<tool_call>" in d["model_text"] and "<tool_response>" in d["response"]
        assert "<tool_response>" not in d["model_text"]
        assert d["num_turns"] >= 4  # prompt, call, tool result, answer (unless the budget cut it)


def test_grpo_tool_agent_with_calculator_on_split_rollout_devices(workspace):
    """The agent loop in the rollout worker of a split placement (1 trainer + 1 rollout process), one step off
    policy: the second and third batches were generated while the previous step trained."""
    rows, dump = run_main_ppo(workspace, "tool", "data", "data.max_response_length=96",
                              "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
                              "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
                              "trainer.staleness=1")
    train = check(rows)
    assert [r["training/policy_staleness"] for r in train] == [0, 1, 1]
    assert all(r["multi_turn/tool_calls/mean"] > 0 for r in train), [r["multi_turn/tool_calls/mean"] for r in train]
    assert all(r["multi_turn/num_turns/max"] >= 4 for r in train)
    assert all(r["multi_turn/interaction_turns/mean"] == 0 for r in train)
    check_masks(dump)


def test_tir_otb_tool_agent_with_calculator_and_gsm8k_interaction(workspace):
    """vLLM engine: the calculator's calls are made, run and fed back, and the GSM8K interaction answers. The
    estimator is verl's multi-turn optimal token baseline (tir_optimal_token_baseline), which weighs each trained
    token by the actor's sum p^2 (actor.calculate_sum_pi_squared; GRPO runs multi-turn in the other tests)."""
    rows, dump = run_main_ppo(workspace, "interaction", "data_gsm8k", "data.max_response_length=192",
                              f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={INTERACTION}",
                              "actor_rollout_ref.rollout.multi_turn.max_user_turns=3",
                              "algorithm.adv_estimator=tir_optimal_token_baseline",
                              "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
                              "reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={OFFSET}",
                              "reward.reward_manager.module.name=OffsetRewardManager",
                              "+reward_model.reward_kwargs.offset=1")
    train = check(rows)
    # OTB's returns are the rewards-to-go (the scores, 1-2 with the offset) and its advantages those minus the
    # group's token baselines, weighted averages of the same returns (GRPO returns its advantages as the returns)
    for r in train:
        assert 1 <= r["critic/returns/min"] <= r["critic/returns/max"] <= 2
        spread = r["critic/score/max"] - r["critic/score/min"]
        assert -spread - 1e-5 <= r["critic/advantages/min"] <= r["critic/advantages/max"] <= 2 + 1e-5
        assert abs(r["critic/advantages/mean"]) < r["critic/returns/mean"] - 0.5
    assert all(r["multi_turn/interaction_turns/mean"] > 0 for r in train)
    assert all(r["multi_turn/tool_calls/mean"] > 0 for r in train)
    retried = [d for d in dump if d["interaction_turns"] > 0 and "Your response is" in d["response"]]
    assert retried, dump  # the interaction's reply is part of the conversation the model continues
    assert all("Your response is" not in d["model_text"] for d in retried)
    check_masks(dump)


def test_grpo_with_an_agent_loop_written_for_verl(workspace):
    """The example loop written against verl's agent-loop API (`AGENT_LOOP=verl` in run_tiny_cpu.sh), imported by
    the workers from PYTHONPATH as a verl user's loop is: its calls run and are fed back, the tool results are
    masked out of the trained tokens, and its timings are logged. On the batched HF fallback engine, whose two
    FSDP ranks stay in step while their trajectories take different numbers of turns (tool_agent runs on vLLM in
    the tests above)."""
    rows, dump = run_main_ppo(workspace, "verl_loop", "data_verl", "data.max_response_length=96",
                              "actor_rollout_ref.rollout.name=hf",
                              f"actor_rollout_ref.rollout.agent.agent_loop_config_path={AGENT_LOOPS}",
                              env={"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "examples" / "multiturn"),
                                                                               os.environ.get("PYTHONPATH")]))})
    train = check(rows)
    assert all(r["multi_turn/generate_s/mean"] > 0 for r in train)
    assert any(r["multi_turn/tool_calls_s/mean"] > 0 for r in train)
    assert all(r["multi_turn/tool_calls/mean"] == 0 for r in train)  # a verl loop reports times, not rlpost's counts
    fed_back = [d for d in dump if "<tool_response>" in d["response"]]
    assert fed_back, dump
    for d in fed_back:
        assert "<tool_call>" in d["model_text"] and "<tool_response>" not in d["model_text"]
        assert d["num_turns"] >= 4
