"""A GRPO run scored by a tiny generative judge through `python -m rlpost.trainer.main_ppo` on CPU: real Ray, FSDP2
over gloo, the policy's vLLM engine, and the judge served by vLLM behind rlpost's OpenAI-compatible server on a pool
of its own. Each dumped score is checked against the judge's verdict recomputed with transformers; bad judge
configs stop before Ray with one line, and the dry run shows the judge's pool."""

import json
import math
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

import rlpost.trainer.config as config_pkg
from rlpost.trainer.main_ppo import run

CONFIG_DIR = str(config_pkg.CONFIG_DIR)
RAY_STARTED = "engine and Ray logs of this run"
TEMPLATE = "Q: {prompt} A: {response} Score:"  # a Hydra override keeps a backslash-n as two characters
DIGIT_BOOST = 8.0  # the judge's output rows of the digits, scaled: its one-token verdict is mostly a digit


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Policy, a judge (other weights, same tokenizer) whose head favours digits, and the arith data."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.utils.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("judge")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root / "data"),
                    "--train_size", "8", "--test_size", "2"], check=True, capture_output=True)
    judge = build_tiny_model(root / "judge", seed=3)
    tok, model = AutoTokenizer.from_pretrained(judge), AutoModelForCausalLM.from_pretrained(judge)
    with torch.no_grad():
        model.get_output_embeddings().weight[[tok.convert_tokens_to_ids(str(d)) for d in range(10)]] *= DIGIT_BOOST
    model.save_pretrained(judge)
    return {"root": root, "policy": str(build_tiny_model(root / "policy")), "judge": str(judge)}


def _args(m, run_dir, *extra: str) -> list[str]:
    return [f"data.train_files={m['root'] / 'data' / 'train.parquet'}", "data.val_files=null",
            "data.train_batch_size=2", "data.max_prompt_length=32", "data.max_response_length=6",
            f"actor_rollout_ref.model.path={m['policy']}", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "reward_model.enable=true", "reward_model.judge.enable=true", f"reward_model.model.path={m['judge']}",
            "reward_model.rollout.name=vllm", "reward_model.enable_resource_pool=true", "reward_model.nnodes=1",
            "reward_model.n_gpus_per_node=1", "reward_model.rollout.prompt_length=128",
            "reward_model.rollout.response_length=8", "reward_model.rollout.dtype=float32",
            f"reward_model.judge.prompt_template='{TEMPLATE}'", "reward_model.judge.max_tokens=1",
            "reward_model.judge.max_concurrency=3", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
            "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.test_freq=-1",
            "trainer.logger=[console]", "ray_init.num_cpus=2", f"trainer.default_local_dir={run_dir}",
            f"trainer.rollout_data_dir={run_dir / 'rollouts'}", *extra]


def _verdicts(judge_path: str, rows: list[dict]) -> list[tuple[float, bool, float]]:
    """(score, parsed, top-2 logit margin) of the judge's greedy one-token verdict on each dumped row, by
    transformers in float32: what the served judge must have answered."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(judge_path), AutoModelForCausalLM.from_pretrained(judge_path)
    out = []
    for row in rows:
        text = TEMPLATE.replace("{prompt}", row["prompt"]).replace("{response}", row["response"])
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        top = logits.topk(2)
        word = tok.decode([int(top.indices[0])])
        parsed = word.strip().isdigit()
        out.append((int(word) / 10 if parsed else 0.0, parsed, float(top.values[0] - top.values[1])))
    return out


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_grpo_scored_by_a_generative_judge_in_its_own_pool(models, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlpost.trainer.main_ppo", *_args(models, tmp_path)],
                          capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "[rlpost] judge: 1 vLLM server(s) of" in proc.stdout
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    metrics = [r for r in metrics if "timing_s/step" in r]
    assert [r["step"] for r in metrics] == [1, 2]
    for r in metrics:
        assert r["reward/judge/requests"] == 4.0  # 2 prompts x rollout.n=2
        assert 0 <= r["reward/judge/parse_failure_count"] <= 4
        assert 0 < r["reward/judge/latency_s_mean"] <= r["reward/judge/latency_s_max"]
        assert all(math.isfinite(v) for k, v in r.items() if isinstance(v, float)), r
    rows = [json.loads(line) for step in (1, 2)
            for line in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    checked = 0
    for row, (score, parsed, margin) in zip(rows, _verdicts(models["judge"], rows)):
        if margin < 1e-3:  # a near-tie: float32 kernels of vLLM and transformers may break it differently
            continue
        checked += 1
        assert row["score"] == pytest.approx(score, abs=1e-6), (row, score)
        assert row["judge_parse_failed"] == int(not parsed)
    assert checked >= 6


def _in_process(args: list[str]) -> int:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return run(compose("ppo_trainer", overrides=args))


@pytest.mark.timeout(300)
def test_dry_run_shows_the_judge_pool(models, tmp_path, capsys):
    assert _in_process(_args(models, tmp_path, "trainer.dry_run=true")) == 0
    out = capsys.readouterr().out
    assert ("judge pool: 1 device(s) = reward_model.nnodes=1 x n_gpus_per_node=1, one vLLM engine of "
            f"{models['judge']} per device") in out
    assert "M parameters" in out.split("judge pool:")[1].splitlines()[0]
    assert "judge scorer: api=chat, parser=last_number, max_score=10.0" in out and "at most 3 requests" in out
    assert f"reward: generative judge {models['judge']}" in out and "roles: actor_rollout (" in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra, message", [
    (["reward_model.model.path=/no/such/judge"], "error: reward_model.model.path='/no/such/judge' is not a local folder"),
    (["reward_model.n_gpus_per_node=2"], "error: trainer.n_gpus_per_node=1 + reward_model.n_gpus_per_node=2 judge = 3 "
                                         "devices, but this machine has 2 CPU(s)"),
    (["reward_model.enable_resource_pool=false"],
     "config error: not supported yet: reward_model.enable_resource_pool=false with a generative reward model"),
    (["reward_model.rollout.name=null"], "config error: reward_model.rollout.name=null with a generative reward model"),
    (["reward_model.n_gpus_per_node=0"], "config error: reward_model.nnodes=1, reward_model.n_gpus_per_node=0: the "
                                         "judge's own pool needs at least one device"),
    (["reward_model.judge.parser=xml"], "config error: reward_model.judge.parser=xml: a verdict parser"),
    (["reward_model.judge.url=http://judge:8000/v1"], "config error: reward_model.judge.url=http://judge:8000/v1, "
                                                      "reward_model.judge.model_name=null"),
    (["custom_reward_function.path=/x.py"], "config error: reward_model.judge.enable=true, custom_reward_function"),
])
def test_bad_judge_configs_stop_before_ray_with_one_line(models, tmp_path, capsys, extra, message):
    assert _in_process(_args(models, tmp_path / "run", *extra)) == 2
    err = capsys.readouterr()
    assert err.err.startswith(message), err.err
    assert err.err.strip().count("\n") == 0 and RAY_STARTED not in err.out + err.err
