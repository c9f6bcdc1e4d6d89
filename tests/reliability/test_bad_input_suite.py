"""The counted bad-input suite: each case is a launch of `main_ppo` (in-process, 2 CPU workers asked for) that
must stop before Ray starts with exit status 2 and one message naming the key or file and a fix, within
seconds, writing nothing into the run folder. Cases that rlpost accepts (with a notice) must reach Ray's
start instead. docs/reliability.md lists these cases by id beside the fault cases of the other tests here."""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import rlpost.single_controller.ray.init as ray_init
import rlpost.trainer.config as config_pkg
from rlpost.trainer.main_ppo import run

CONFIG_DIR = config_pkg.__path__[0]
MAX_SECONDS = 60  # loaded 2-core CI machine; typically 1-3 s (a vLLM import for engine_kwargs: ~15 s)


class _ReachedRay(Exception):
    """Start-up checks passed: the launch would start Ray now."""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("bad_inputs")
    subprocess.run([sys.executable, "examples/data_preprocess/arith.py", "--local_dir", str(root),
                    "--train_size", "8", "--test_size", "4"], check=True, capture_output=True)
    frame = pd.read_parquet(root / "train.parquet")
    frame.iloc[:0].to_parquet(root / "empty.parquet")
    no_content = frame.copy()
    no_content.at[0, "prompt"] = [{"role": "user"}]
    no_content.to_parquet(root / "no_content.parquet")
    null_prompt = frame.copy()
    null_prompt["prompt"] = null_prompt["prompt"].astype(object)
    null_prompt.at[1, "prompt"] = None
    null_prompt.to_parquet(root / "null_prompt.parquet")
    (root / "not_parquet.parquet").write_text("not parquet")
    (root / "syntax_error.py").write_text("def compute_score(:\n")
    (root / "odd_rows_fail.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1 / 0 if int(ground_truth) % 2 else 1.0\n")
    (root / "file_not_folder").write_text("x")
    empty_prompts = frame.copy()
    empty_prompts["prompt"] = [[{"role": "user", "content": ""}]] * len(frame)
    empty_prompts.to_parquet(root / "empty_prompts.parquet")
    _broken_models(root, Path(tiny_model_dir))
    return {"root": root, "model": tiny_model_dir}


def _broken_models(root: Path, model: Path) -> None:
    """Copies of the tiny model, each damaged one way a download or a disk damages a folder."""
    def copy(name: str) -> Path:
        return Path(shutil.copytree(model, root / name))

    weights = copy("truncated") / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)  # an interrupted download
    weights = copy("nan_weights") / "model.safetensors"
    with open(weights, "r+b") as f:  # overwritten in place, same size: 0xff bytes are NaN as float32 or bf16
        f.seek(weights.stat().st_size // 2)
        f.write(b"\xff" * 4096)
    with open(copy("bad_config") / "config.json", "a") as f:
        f.write("}\n,")
    (copy("no_weights") / "model.safetensors").unlink()
    no_tokenizer = copy("no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (no_tokenizer / name).unlink()
    (root / "adapter_without_weights").mkdir()
    (root / "adapter_without_weights" / "adapter_config.json").write_text(
        '{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "peft_type": "LORA"}')


# (id, what the user did, overrides with {root}/{model} placeholders, fragments the message must hold).
# Fragment None: accepted, the launch reaches Ray's start.
CASES = [
    ("B01", "empty training file", ["data.train_files={root}/empty.parquet"],
     ["data.train_files={root}/empty.parquet: no training rows"]),
    ("B02", "chat message without content", ["data.train_files={root}/no_content.parquet"],
     ["no_content.parquet row 0", "data.prompt_key", "has no text 'content'"]),
    ("B03", "null prompt", ["data.train_files={root}/null_prompt.parquet"],
     ["null_prompt.parquet row 1", "not text or a non-empty list of messages"]),
    ("B04", "filter_overlong_prompts drops every row", ["data.filter_overlong_prompts=true", "data.max_prompt_length=2"],
     ["no training rows left after filter_overlong_prompts", "data.max_prompt_length"]),
    ("B05", "prompt + response above the model's context", ["data.max_response_length=100000"],
     ["data.max_prompt_length + data.max_response_length = 100032", "context of 4096",
      "lower data.max_response_length to <= 4064"]),
    ("B06", "deprecated global micro-batch disagrees with the explicit per-device one",
     ["actor_rollout_ref.actor.ppo_micro_batch_size=8"],
     ["ppo_micro_batch_size=8 (deprecated) and actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
      "remove actor_rollout_ref.actor.ppo_micro_batch_size"]),
    ("B07", "more CPU workers than Ray has CPUs", ["trainer.n_gpus_per_node=4", "ray_init.num_cpus=2"],
     ["trainer.n_gpus_per_node=4 CPU worker processes", "use trainer.n_gpus_per_node=2"]),
    ("B08", "CUDA asked on a machine without GPUs", ["trainer.device=cuda"],
     ["0 CUDA device(s) visible", "trainer.device=cpu"]),
    ("B09", "reward file with a syntax error", ["custom_reward_function.path={root}/syntax_error.py"],
     ["custom_reward_function.path: error while importing", "syntax_error.py", "SyntaxError"]),
    ("B10", "reward function failing on some rows", ["custom_reward_function.path={root}/odd_rows_fail.py"],
     ["data.train_files=", "ZeroDivisionError", "rows tried)"]),
    ("B11", "reward function name not in the file",
     ["custom_reward_function.path={root}/odd_rows_fail.py", "custom_reward_function.name=score"],
     ["custom_reward_function.name: 'score' not found", "callables there: ['compute_score']"]),
    ("B12", "prompt column missing", ["data.prompt_key=question"],
     ["data.prompt_key: column 'question' not found", "available columns"]),
    ("B13", "reward model folder missing", ["reward_model.enable=true", "reward_model.model.path=/no/rm"],
     ["reward_model.model.path='/no/rm' is not a local folder"]),
    ("B14", "resume_path that is not a checkpoint",
     ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/no/ckpt/global_step_3"],
     ["trainer.resume_from_path='/no/ckpt/global_step_3' is not a complete checkpoint", "resume_mode=auto"]),
    ("B15", "unknown logger", ["trainer.logger=[console,foo]"], ["trainer.logger", "'foo'", "must be one of"]),
    ("B16", "gpu_memory_utilization above 1", ["actor_rollout_ref.rollout.gpu_memory_utilization=1.5"],
     ["gpu_memory_utilization=1.5: must be in (0, 1]"]),
    ("B17", "rollout.n = 0", ["actor_rollout_ref.rollout.n=0"], ["actor_rollout_ref.rollout.n=0: must be an integer >= 1"]),
    ("B18", "max_response_length = 0", ["data.max_response_length=0"], ["data.max_response_length=0"]),
    ("B19", "negative learning rate", ["actor_rollout_ref.actor.optim.lr=-1"], ["optim.lr=-1.0: must be >= 0"]),
    ("B20", "tool config file missing", ["actor_rollout_ref.rollout.multi_turn.enable=true",
                                         "actor_rollout_ref.rollout.multi_turn.tool_config_path=/no/tools.yaml"],
     ["actor_rollout_ref.rollout.multi_turn.tool_config_path: file not found: '/no/tools.yaml'"]),
    ("B21", "SGLang on CPU", ["actor_rollout_ref.rollout.name=sglang"], ["rollout.name=sglang", "use actor_rollout_ref.rollout.name=vllm"]),
    ("B22", "misspelt vLLM engine argument", ["+actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eagre=true"],
     ["engine_kwargs.vllm.enforce_eagre: not an argument", "did you mean enforce_eager"]),
    ("B23", "tokenizer folder missing", ["actor_rollout_ref.model.tokenizer_path=/no/tok"],
     ["actor_rollout_ref.model.tokenizer_path='/no/tok' is not a local folder"]),
    ("B24", "validation file missing", ["data.val_files=/no/val.parquet"], ["data.val_files: file not found: '/no/val.parquet'"]),
    ("B25", "data file that is not parquet", ["data.train_files={root}/not_parquet.parquet"],
     ["not_parquet.parquet cannot be read as parquet", "data files must be parquet"]),
    ("B26", "train batch larger than the data", ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=64"],
     ["data.train_batch_size=64 is larger than the training set (8 rows", "<= 8"]),
    ("B27", "mini-batch not dividing the train batch", ["actor_rollout_ref.actor.ppo_mini_batch_size=3"],
     ["ppo_mini_batch_size must divide train_batch_size", "ppo_mini_batch_size=2"]),
    ("B28", "unknown KL type", ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=foo"],
     ["kl_loss_type=foo: must be one of", "low_var_kl"]),
    ("B29", "negative temperature", ["actor_rollout_ref.rollout.temperature=-1"], ["temperature=-1.0: must be >= 0"]),
    ("B30", "save_freq not an integer", ["trainer.save_freq=abc"], ["trainer.save_freq='abc': expected int"]),
    ("B31", "zero epochs", ["trainer.total_epochs=0"], ["trainer.total_epochs=0: must be an integer >= 1"]),
    ("B32", "unknown advantage estimator", ["algorithm.adv_estimator=foo"], ["algorithm.adv_estimator=foo: must be one of", "grpo"]),
    ("B33", "unknown checkpoint content", ["actor_rollout_ref.actor.checkpoint.save_contents=[foo]"],
     ["save_contents=['foo'] (entry 'foo'): must be one of"]),
    ("B34", "GRPO with one response per prompt (runs, as in verl, with a warning)", ["actor_rollout_ref.rollout.n=1"], None),
    ("B35", "rollout TP 2 on CPU (verl's default TP; runs: vLLM's external_launcher over gloo)",
     ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"], None),
    ("B36", "critic model missing with GAE", ["algorithm.adv_estimator=gae", "critic.model.path=/no/critic",
                                              "critic.ppo_micro_batch_size_per_gpu=2"],
     ["critic.model.path='/no/critic' is not a local folder"]),
    ("B37", "training file missing", ["data.train_files=/no/train.parquet"], ["data.train_files: file not found: '/no/train.parquet'"]),
    ("B38", "policy model folder missing", ["actor_rollout_ref.model.path=/no/model"],
     ["actor_rollout_ref.model.path='/no/model' is not a local folder", "scripts/make_tiny_model.py"]),
    ("B39", "checkpoint folder is a file", ["trainer.default_local_dir={root}/file_not_folder"],
     ["cannot hold checkpoints and logs", "is a file, not a folder"]),
    ("B40", "custom reward name without a path", ["custom_reward_function.name=my_score"],
     ["custom_reward_function.name='my_score' is set but custom_reward_function.path is null"]),
    ("B41", "Ulysses size not dividing the workers", ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"],
     ["ulysses_sequence_parallel_size=3"]),
    ("B42", "LoRA rank below zero", ["actor_rollout_ref.model.lora_rank=-1"], ["lora_rank=-1"]),
    ("B43", "micro-batch not dividing the per-device mini-batch", ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
     ["ppo_micro_batch_size_per_gpu=3"]),
    ("B44", "truncation mode misspelt", ["data.truncation=cut"], ["data.truncation=cut: must be one of"]),
    ("B45", "reward model packed with Ulysses SP 2 (accepted)",
     ["reward_model.enable=true", "reward_model.model.path={model}", "reward_model.model.use_remove_padding=true",
      "reward_model.ulysses_sequence_parallel_size=2"], None),
    ("B46", "LoRA target_modules with a typo beside a valid name",
     ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[q_projj,v_proj]"],
     ["['q_projj'] match no module", "use ['v_proj'] or all-linear"]),
    ("B47", "MoE router replay on a dense model", ["actor_rollout_ref.actor.router_replay.mode=R2"],
     ["actor_rollout_ref.actor.router_replay.mode=R2: a qwen2 model is dense",
      "set actor_rollout_ref.actor.router_replay.mode=disabled"]),
    ("B48", "rollout routing replay (R3, not built)", ["actor_rollout_ref.actor.router_replay.mode=R3"],
     ["not supported yet", "router_replay.mode=R3"]),
    ("B49", "truncated model weights (an interrupted download)", ["actor_rollout_ref.model.path={root}/truncated"],
     ["actor_rollout_ref.model.path: {root}/truncated/model.safetensors is", "truncated", "bytes missing"]),
    ("B50", "model weights overwritten in place (same size, NaN values)",
     ["actor_rollout_ref.model.path={root}/nan_weights"],
     ["{root}/nan_weights/model.safetensors holds 1024 NaN/inf value(s) in", "NaN from step 1"]),
    ("B51", "config.json that is not JSON", ["actor_rollout_ref.model.path={root}/bad_config"],
     ["{root}/bad_config/config.json is not valid JSON (line"]),
    ("B52", "model folder without tokenizer files", ["actor_rollout_ref.model.path={root}/no_tokenizer"],
     ["actor_rollout_ref.model.path='{root}/no_tokenizer' holds no tokenizer files", "files there: config.json"]),
    ("B53", "model folder without weights", ["actor_rollout_ref.model.path={root}/no_weights"],
     ["actor_rollout_ref.model.path='{root}/no_weights' holds no weights"]),
    ("B54", "LoRA adapter folder without weights",
     ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_adapter_path={root}/adapter_without_weights"],
     ["actor_rollout_ref.model.lora_adapter_path='{root}/adapter_without_weights'",
      "adapter_model.safetensors not found", "files in the folder: ['adapter_config.json']"]),
    ("B55", "dry run of a truncated model", ["trainer.dry_run=true", "actor_rollout_ref.model.path={root}/truncated"],
     ["{root}/truncated/model.safetensors is", "truncated"]),
    ("B56", "every prompt empty", ["data.train_files={root}/empty_prompts.parquet"],
     ["8 of 8 rows of {root}/empty_prompts.parquet have a prompt without text", "row 0", "nothing to train on"]),
    ("B57", "mini-batch rounding to 0 rows per worker",
     ["actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.rollout.n=1"],
     ["actor_rollout_ref.actor.ppo_mini_batch_size=1 x rollout.n=1 = 1 responses, 2 data-parallel ranks",
      "use actor_rollout_ref.actor.ppo_mini_batch_size=4"]),
    ("B58", "empty validation file", ["data.val_files={root}/empty.parquet"],
     ["data.val_files={root}/empty.parquet: no validation rows", "data.val_files=null"]),
    ("B59", "train batch not dividing over the devices",
     ["data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.rollout.n=1"],
     ["data.train_batch_size=3 x actor_rollout_ref.rollout.n=1 = 3 responses",
      "trainer.nnodes x trainer.n_gpus_per_node = 2 devices", "use data.train_batch_size=4"]),
    ("B60", "vLLM expert parallelism on CPU", ["+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_expert_parallel=true"],
     ["not supported yet: actor_rollout_ref.rollout.engine_kwargs.vllm.enable_expert_parallel=true",
      "cpu_fused_moe.cpp", "leave it unset"]),
    ("B61", "MoE load metrics on a dense model", ["actor_rollout_ref.rollout.moe_load_balance_metrics_interval=5"],
     ["actor_rollout_ref.rollout.moe_load_balance_metrics_interval=5: a", "is dense",
      "set actor_rollout_ref.rollout.moe_load_balance_metrics_interval=0"]),
]

BASE = ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.model.path={model}", "data.train_files={root}/train.parquet",
        "data.val_files={root}/test.parquet", "data.train_batch_size=4", "data.max_prompt_length=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.logger=[console]",
        "trainer.default_local_dir={root}/run_{case}"]


def _launch(overrides: list[str]) -> tuple[object, str]:
    """(exit status or _ReachedRay, stderr) of one in-process launch."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            try:
                status = run(compose("ppo_trainer", overrides=overrides))
            except _ReachedRay:
                status = _ReachedRay
    return status, err.getvalue()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_stops_before_ray_with_one_message(case, inputs, monkeypatch):
    case_id, _, overrides, fragments = case

    def reached_ray(*args, **kwargs):
        raise _ReachedRay()

    monkeypatch.setattr(ray_init, "init_ray", reached_ray)  # guard: no case may start a cluster
    fill = {**inputs, "case": case_id}
    later = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    base = [o for o in BASE if o.split("=", 1)[0] not in later]  # a case's own value replaces the base's
    start = time.perf_counter()
    status, err = _launch([o.format(**fill) for o in base + overrides])
    seconds = time.perf_counter() - start
    if fragments is None:
        assert status is _ReachedRay, err
        return
    message = " ".join(err.split())
    assert status == 2, f"{case_id}: status {status}; stderr: {err}"
    for fragment in fragments:
        assert " ".join(fragment.format(**fill).split()) in message, f"{case_id}: {fragment!r} not in {err!r}"
    assert "Traceback" not in err.split("--- reward function traceback ---")[0], err  # one message, no trace
    assert seconds < MAX_SECONDS
    run_dir = Path(fill["root"]) / f"run_{case_id}"
    assert not run_dir.exists() or not any(run_dir.iterdir()), "a refused launch must write nothing"
