"""End to end: `python -m rlpost.trainer.main_ppo` on CPU with 2 worker processes, the real vLLM CPU engine,
real Ray and FSDP2 over gloo, a tiny model and the synthetic arithmetic data. Each run trains 3 steps."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]

REQUIRED = [
    "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "critic/advantages/max",
    "response_length/mean", "response_length/max", "response_length/clip_ratio", "prompt_length/mean",
    "perf/throughput", "perf/time_per_step", "perf/cpu_memory_used_gb", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/lr",
    "actor/pg_clipfrac", "actor/ppo_kl", "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob",
    "timing_s/adv", "timing_s/update_actor", "timing_s/update_weights", "timing_s/step",
    "timing_s/gen_wake", "timing_s/gen_engine", "timing_s/gen_sleep",
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("ppo_e2e")
    data = root / "data"
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(data),
                    "--train_size", "64", "--test_size", "8"], check=True, capture_output=True)
    return {"model": tiny_model_dir, "data": data, "root": root}


def run_main_ppo(ws, name: str, *overrides: str) -> list[dict]:
    out = ws["root"] / name
    cmd = [
        sys.executable, "-m", "rlpost.trainer.main_ppo",
        f"data.train_files={ws['data'] / 'train.parquet'}", f"data.val_files={ws['data'] / 'test.parquet'}",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=8",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=3",
        "trainer.test_freq=3", "trainer.save_freq=-1", "trainer.logger=[console]", "ray_init.num_cpus=2",
        f"trainer.default_local_dir={out}", *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def check_metrics(rows: list[dict], extra: tuple[str, ...] = (), core: str = "reward") -> None:
    """Steps 1-3 with every REQUIRED metric finite, and validation's val-core metric (`acc` when the reward
    returns one, else `reward`, as in verl)."""
    train = [r for r in rows if "timing_s/step" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for row in train:
        for key in REQUIRED + list(extra):
            assert key in row, f"{key} missing at step {row['step']}"
            assert isinstance(row[key], (int, float)) and math.isfinite(row[key]), (key, row[key])
        parts = sum(row[f"timing_s/gen_{p}"] for p in ("wake", "engine", "sleep"))
        assert 0 < parts <= row["timing_s/gen"], "the rollout worker's parts of gen fall inside it"
    assert any(k.startswith(f"val-core/rlpost/arith/{core}/mean@") for k in train[-1]), "validation did not run"


def test_gdpo_with_kl_loss_engine_knobs_and_a_torch_profile(workspace):
    """GDPO (GRPO's group normalisation per reward component) with the KL loss against the reference and the
    engine's own log-probs, with the FSDP engine knobs on (reward in the background, forward prefetch, activation
    offload, a 1 MB weight-sync bucket): each knob is checked for equal values in its own test; here they run in
    the loop. The torch profiler captures step 2 on every rank. The reward manager is a class written against
    verl's API, loaded from its file (examples/reward_manager/offset_reward_manager.py: the built-in score +
    reward_kwargs.offset, and the score alone as the `base_score` component gdpo normalises). (One run for all:
    each run costs a Ray start, two workers and their models.)"""
    profile = workspace["root"] / "profile"
    manager = REPO / "examples/reward_manager/offset_reward_manager.py"
    rows = run_main_ppo(workspace, "gdpo", "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[base_score]",
                        "reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={manager}",
                        "reward.reward_manager.module.name=OffsetRewardManager", "+reward_model.reward_kwargs.offset=10",
                        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.01",
                        "actor_rollout_ref.rollout.calculate_log_probs=true",
                        "reward_model.launch_reward_fn_async=true",
                        "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
                        "actor_rollout_ref.model.enable_activation_offload=true",
                        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
                        "global_profiler.tool=torch", "global_profiler.steps=[2]", f"global_profiler.save_path={profile}",
                        "actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.all_ranks=true")
    check_metrics(rows, ("actor/kl_loss", "timing_s/ref", "training/rollout_probs_diff_mean",
                         "training/rollout_probs_diff_max", "timing_s/reward_wait"))
    assert rows[-1]["training/rollout_probs_diff_mean"] < 0.05
    train = [r for r in rows if "timing_s/step" in r]
    assert all(10 <= r["critic/score/min"] <= r["critic/score/max"] <= 11 for r in train)  # the manager's offset
    assert all(0 <= r["gdpo/base_score/mean"] <= 1 for r in train)  # the component, without the offset
    assert all(abs(r["critic/advantages/mean"]) < 1e-4 for r in train)  # gdpo whitens over the batch
    # actor, rollout (follows the actor's switch) and the reference share each process: one trace per rank
    assert sorted(p.name for p in profile.iterdir()) == ["step2_actor+rollout_rank0.json", "step2_actor+rollout_rank1.json"]
    for path in profile.iterdir():
        events = json.loads(path.read_text())["traceEvents"]
        assert len(events) > 100
        assert any("aten::" in str(e.get("name")) for e in events)  # the phases' torch ops were recorded
    # on CPU no per-phase device peaks are made up
    assert not [k for r in rows for k in r if k.startswith("perf/max_memory_allocated_gb/")]


def reward_model_dir(ws) -> str:
    """A sequence-classification RM (random score head) on the tiny model's backbone, made once per module."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForSequenceClassification

    rm_dir = ws["root"] / "rm"
    if not (rm_dir / "config.json").is_file():
        config = AutoConfig.from_pretrained(ws["model"], num_labels=1)
        torch.manual_seed(0)
        Qwen2ForSequenceClassification(config).save_pretrained(rm_dir)
        AutoTokenizer.from_pretrained(ws["model"]).save_pretrained(rm_dir)
    return str(rm_dir)


def check_rm_scores(rows: list[dict]) -> None:
    """The RM's continuous scores replaced the rule scorer's 0/1 ones."""
    scores = [r[k] for r in rows if "timing_s/step" in r for k in ("critic/score/max", "critic/score/min")]
    assert any(abs(s - round(s)) > 1e-6 for s in scores), scores


def test_ppo_gae_with_critic_hf_rollout_and_reward_model(workspace):
    """PPO (GAE) with the critic on its plain path (no LoRA, no sequence parallelism: those run below), the HF
    generate() rollout, and a sequence-classification RM, turned on with verl's newer spelling
    (reward.reward_model.enable, reward.reward_model.model_path), scores every response in the loop; its
    continuous scores replace the rule scorer's 0/1 ones. The critic trains with torch's SGD (Nesterov momentum),
    the actor with Adam (amsgrad), and the actor's loss takes the engine's log-probs through rollout correction
    (token weights, token rejection with its own lower bound, the catastrophic-token veto); the last step is saved
    and the optimiser shards show each optimiser's state. (One run for these features: each run costs a Ray start,
    two workers and their models. RLOO runs end to end in test_multinode_e2e.py, reinforce_plus_plus in
    test_resume_e2e.py.)"""
    rows = run_main_ppo(workspace, "gae_hf_rm", "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.name=hf",
                        f"critic.model.path={workspace['model']}", "critic.ppo_mini_batch_size=2",
                        "critic.ppo_micro_batch_size_per_gpu=2", "critic.forward_micro_batch_size_per_gpu=4",
                        "critic.optim.lr=1e-4", "reward.reward_model.enable=true",
                        f"reward.reward_model.model_path={reward_model_dir(workspace)}",
                        "reward_model.micro_batch_size_per_gpu=4",
                        "critic.optim.optimizer=SGD", "critic.optim.override_optimizer_config={momentum:0.9,nesterov:true}",
                        "actor_rollout_ref.actor.optim.optimizer=Adam",
                        "actor_rollout_ref.actor.optim.override_optimizer_config={amsgrad:true}",
                        "actor_rollout_ref.rollout.calculate_log_probs=true",
                        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token",
                        "algorithm.rollout_correction.rollout_rs_threshold=4.0",
                        "algorithm.rollout_correction.rollout_rs_threshold_lower=0.1",
                        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4", "trainer.save_freq=3")
    check_metrics(rows, ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
                         "critic/lr", "critic/values/mean", "timing_s/values", "timing_s/update_critic",
                         "rollout_corr/is_weight_mean", "rollout_corr/veto_seq_frac", "rollout_corr/rejected_frac"))
    check_rm_scores(rows)
    step = workspace["root"] / "gae_hf_rm" / "global_step_3"
    for role, key in (("actor", "max_exp_avg_sq"), ("critic", "momentum_buffer")):
        states = list(torch.load(step / role / "optim_world_size_2_rank_0.pt", weights_only=False)["state"].values())
        assert states and all(key in st for st in states), (role, key)


def test_lora_actor_and_critic_then_export(workspace, tmp_path):
    """GAE with LoRA on actor (vLLM serves the adapter, reference = adapters off) and critic; the checkpoint
    holds adapters only and exports as a PEFT folder or, merged, as a HF model computing what PEFT computes."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlpost.model_merger import main as merger_main

    rows = run_main_ppo(workspace, "lora", "algorithm.adv_estimator=gae", f"critic.model.path={workspace['model']}",
                        "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=2",
                        "critic.forward_micro_batch_size_per_gpu=4", "critic.model.lora_rank=8",
                        "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.use_kl_loss=true",
                        "actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.save_freq=3")
    check_metrics(rows, ("actor/kl_loss", "timing_s/ref", "critic/vf_loss", "training/rollout_probs_diff_mean"))
    assert rows[-1]["training/rollout_probs_diff_mean"] < 0.05  # the engine generates with the trained adapter
    ckpt = workspace["root"] / "lora" / "global_step_3"
    shard = torch.load(ckpt / "actor" / "model_world_size_2_rank_0.pt", weights_only=False)
    assert shard and all(".lora_" in k for k in shard)  # the frozen base is not copied into checkpoints
    # the merger's CLI in this process (its `python -m` launch is tested in tests/reliability/test_checkpoint_e2e.py)
    for role in ("actor", "critic"):
        for flag, out in (([], "adapter"), (["--merge_lora"], "merged")):
            assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(ckpt / role), "--target_dir",
                                str(tmp_path / role / out), *flag]) == 0
    assert (tmp_path / "actor" / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "critic" / "merged" / "model.safetensors").is_file()
    ids = torch.tensor([[5, 17, 30, 41, 9, 12]])
    base = AutoModelForCausalLM.from_pretrained(workspace["model"], dtype=torch.float32)
    with torch.no_grad():
        want = PeftModel.from_pretrained(base, str(tmp_path / "actor" / "adapter")).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "actor" / "merged", dtype=torch.float32)(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(workspace["model"], dtype=torch.float32)(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4  # three updates moved the policy away from the base


def test_ppo_gae_with_ulysses_sequence_parallel(workspace):
    """PPO (GAE) with every model role on Ulysses SP 2 over the 2 workers (one data-parallel group): actor and
    reference, the critic (values and update) and the reward model (its scores replace the rule's). The log-probs
    of the sequence-parallel forward agree with the vLLM engine's own (training/rollout_probs_diff_max)."""
    rows = run_main_ppo(workspace, "ulysses", "algorithm.adv_estimator=gae",
                        "actor_rollout_ref.model.use_remove_padding=true",
                        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.01",
                        "actor_rollout_ref.rollout.calculate_log_probs=true",
                        f"critic.model.path={workspace['model']}", "critic.model.use_remove_padding=true",
                        "critic.ulysses_sequence_parallel_size=2", "critic.ppo_mini_batch_size=2",
                        "critic.ppo_micro_batch_size_per_gpu=2", "critic.forward_micro_batch_size_per_gpu=4",
                        "critic.optim.lr=1e-4", "reward_model.enable=true",
                        f"reward_model.model.path={reward_model_dir(workspace)}",
                        "reward_model.model.use_remove_padding=true", "reward_model.ulysses_sequence_parallel_size=2",
                        "reward_model.micro_batch_size_per_gpu=4")
    check_metrics(rows, ("actor/kl_loss", "timing_s/ref", "training/rollout_probs_diff_max", "critic/vf_loss",
                         "critic/grad_norm", "critic/values/mean", "timing_s/values", "timing_s/update_critic"))
    check_rm_scores(rows)
    train = [r for r in rows if "timing_s/step" in r]
    # The tiny model's token probabilities are ~1e-3; the bf16 engine and the float32 SP forward agree to ~1e-5
    # at most, an attention that mixes sequences or heads would be off by about the probabilities themselves.
    assert max(r["training/rollout_probs_diff_max"] for r in train) < 5e-4


ACC_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A plain number that varies between the responses of one prompt (the dapo manager records it as 'acc')."""
    return float(len(solution_str) % 2)
'''


def test_codapo_alternates_original_and_focused_steps_and_resumes_between_them(workspace, tmp_path):
    """verl's CoDaPO recipe keys (`+algorithm.codapo_*`, the dapo manager's 'acc', trainer.use_v1): step 1 is an
    original step on a data-loader batch, step 2 the focused step on its best question (top_k=1, so all four
    prompts are that question), step 3 original again. The checkpoint of step 1 keeps the focused batch: a run
    resumed from it trains the focused step next."""
    fn = tmp_path / "acc_reward.py"
    fn.write_text(ACC_REWARD)
    keys = ["algorithm.adv_estimator=codapo", "+algorithm.codapo_top_k=1", "+algorithm.codapo_weight_offset=0.1",
            "+algorithm.codapo_accuracy_key=acc", "reward.reward_manager.name=dapo", "trainer.use_v1=true",
            f"custom_reward_function.path={fn}", "custom_reward_function.name=compute_score"]
    out = workspace["root"] / "codapo"
    rows = run_main_ppo(workspace, "codapo", *keys, "trainer.save_freq=1", f"trainer.rollout_data_dir={out}/dump")
    check_metrics(rows, core="acc")  # the dapo manager's acc
    train = [r for r in rows if "timing_s/step" in r]
    assert [r["codapo/is_focused_step"] for r in train] == [0.0, 1.0, 0.0]
    for r in (train[0], train[2]):  # original steps value their questions and pick the best one
        assert 0 <= r["codapo/value/mean"] <= r["codapo/selected_value/mean"] <= 1
    prompts = {step: {json.loads(line)["prompt"] for line in (out / "dump" / f"{step}.jsonl").open()}
               for step in (1, 2)}
    assert len(prompts[1]) == 4 and len(prompts[2]) == 1 and prompts[2] <= prompts[1]
    assert (out / "global_step_1" / "codapo_focus.pt").is_file()
    assert not (out / "global_step_2" / "codapo_focus.pt").exists()  # nothing pending after a focused step
    resumed = run_main_ppo(workspace, "codapo_resumed", *keys, "trainer.total_training_steps=2",
                           "trainer.resume_mode=resume_path", f"trainer.resume_from_path={out}/global_step_1",
                           f"trainer.rollout_data_dir={out}/dump_resumed")
    assert [r["codapo/is_focused_step"] for r in resumed if "timing_s/step" in r] == [1.0]  # step 2 only
    assert {json.loads(line)["prompt"] for line in (out / "dump_resumed" / "2.jsonl").open()} == prompts[2]


def test_skip_rollout_trains_every_step_on_the_first_steps_saved_batch(workspace, tmp_path):
    """verl's rollout skip: step 1 generates, scores and saves its batch; steps 2 and 3 train on it again (same
    prompts, responses and scores, no generation), and a second run of the same experiment loads it at its step 1.
    (A saved file that does not fit the run: tests/trainer/ppo/test_rollout_skip.py.)"""
    dump = tmp_path / "skip"
    keys = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.skip_rollout=true",
            f"actor_rollout_ref.rollout.skip_dump_dir={dump}",
            "trainer.experiment_name=skip_e2e", "trainer.val_before_train=false", "trainer.test_freq=-1",
            f"trainer.rollout_data_dir={tmp_path / 'rollouts'}"]
    rows = [r for r in run_main_ppo(workspace, "skip", *keys) if "timing_s/step" in r]
    assert [r["rollout_skip/loaded"] for r in rows] == [0.0, 1.0, 1.0]
    assert "timing_s/gen" in rows[0] and all("timing_s/gen" not in r for r in rows[1:])
    texts = [[json.loads(line)["response"] for line in (tmp_path / "rollouts" / f"{s}.jsonl").open()] for s in (1, 2, 3)]
    assert texts[0] == texts[1] == texts[2]
    assert rows[0]["critic/score/mean"] == rows[1]["critic/score/mean"] == rows[2]["critic/score/mean"]
    assert all(math.isfinite(r["actor/pg_loss"]) for r in rows[1:])  # the updates ran on it
    saved = list(dump.glob("skip_e2e_*_GBS4__N2.rlpost.pkl"))
    assert len(saved) == 1
    again = [r for r in run_main_ppo(workspace, "skip_again", *keys, "trainer.total_training_steps=1")
             if "timing_s/step" in r]
    assert again[0]["rollout_skip/loaded"] == 1.0 and again[0]["critic/score/mean"] == rows[0]["critic/score/mean"]
