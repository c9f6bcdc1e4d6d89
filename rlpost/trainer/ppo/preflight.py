"""Checks of the run's inputs that need the file system or the machine, made before any worker starts.

The config itself is validated earlier (`rlpost.trainer.config`); here: every model folder the run loads,
the data files, and whether this machine has the devices the config asks for. Each failure is one
`ValueError` naming the key, the value and what to use instead.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from rlpost.trainer.config.roles import generative_judge, need_critic
from rlpost.utils.model_files import check_model_folder


def missing_folder(key: str, path: Any) -> str:
    """The message for a model key whose folder is not on this machine."""
    return (f"{key}={path!r} is not a local folder; no model hub is used at run time: point it at a HF model "
            "folder (config.json + weights), e.g. one made by scripts/make_tiny_model.py")


def model_folders(config: Any) -> dict[str, str]:
    """{key: folder} of every model the run loads: the policy, the critic when one is used, the reward model."""
    folders = {"actor_rollout_ref.model.path": config.actor_rollout_ref.model.path}
    if need_critic(config):
        folders["critic.model.path"] = config.critic.model.path
    if config.reward_model.enable and not (generative_judge(config) and config.reward_model.judge.url):
        folders["reward_model.model.path"] = config.reward_model.model.path
    if config.distillation.enabled:
        folders.update({f"distillation.teacher_models.{name}.model_path": t.model_path
                        for name, t in config.distillation.teacher_models.items() if t.model_path})
    return folders


def check_model_and_data_paths(config: Any) -> None:
    """Every model folder (policy, critic, reward model) the run will read exists and is whole
    (`rlpost.utils.model_files`), and so does every data file."""
    folders = model_folders(config)
    for key, path in folders.items():
        if not os.path.isdir(os.path.expanduser(str(path))):
            raise ValueError(missing_folder(key, path))
        check_model_folder(key, str(path))  # a truncated or NaN weights file, a broken config.json: named here
    check_teacher_vocabularies(config)
    rollout = config.actor_rollout_ref.rollout
    for key, path in (("actor_rollout_ref.rollout.multi_turn.tool_config_path", rollout.multi_turn.tool_config_path),
                      ("actor_rollout_ref.rollout.multi_turn.interaction_config_path",
                       rollout.multi_turn.interaction_config_path),
                      ("actor_rollout_ref.rollout.agent.agent_loop_config_path", rollout.agent.agent_loop_config_path)):
        if path and not os.path.isfile(os.path.expanduser(str(path))):
            raise ValueError(f"{key}: file not found: {path!r}; give the YAML file (see docs/multiturn.md), or null")
    for key in ("data.train_files", "data.val_files"):
        files = config.data[key.split(".")[1]]
        for path in [files] if isinstance(files, str) else list(files or []):
            if not os.path.isfile(os.path.expanduser(str(path))):
                raise ValueError(f"{key}: file not found: {path!r}; give the parquet file(s) of your data, e.g. "
                                 "made by examples/data_preprocess/gsm8k.py")


def check_teacher_vocabularies(config: Any) -> None:
    """Each distillation teacher reads the student's token ids: its tokenizer must map the same strings to the
    same ids as the policy's (a different tokenizer is refused, whatever its size)."""
    if not config.distillation.enabled:
        return
    from rlpost.utils.tokenizer import auto_tokenizer

    model = config.actor_rollout_ref.model
    student_path = model.tokenizer_path or model.path
    student = auto_tokenizer().from_pretrained(os.path.expanduser(str(student_path))).get_vocab()
    for name, teacher in config.distillation.teacher_models.items():
        if not teacher.model_path:
            continue
        vocab = auto_tokenizer().from_pretrained(os.path.expanduser(str(teacher.model_path))).get_vocab()
        if vocab == student:
            continue
        differ = sorted(set(vocab.items()) ^ set(student.items()), key=lambda kv: kv[1])[0]
        raise ValueError(f"distillation.teacher_models.{name}.model_path={teacher.model_path!r}: its tokenizer differs "
                         f"from the policy's ({student_path}): {len(vocab)} vs {len(student)} tokens, e.g. token "
                         f"{differ[0]!r} -> id {differ[1]} in one only; the teacher scores the student's token ids, so "
                         "use a teacher of the same tokenizer (same family)")


def check_lora_inputs(config: Any) -> None:
    """With LoRA on: a `lora_adapter_path` is an adapter folder (of `lora_rank` when that is set; its layer shapes
    are checked when the workers load it), else `target_modules` select layers of the model."""
    from rlpost.engine.lora import check_adapter_folder, check_target_modules
    from rlpost.utils.lora_config import lora_enabled

    groups = {"actor_rollout_ref.model": config.actor_rollout_ref.model}
    if need_critic(config):
        groups["critic.model"] = config.critic.model
    for group, model_cfg in groups.items():
        if not lora_enabled(model_cfg):
            continue
        if importlib.util.find_spec("peft") is None:
            raise ValueError(f"{group}.lora_rank={model_cfg.lora_rank}, {group}.lora_adapter_path="
                             f"{model_cfg.lora_adapter_path}: LoRA needs PEFT, which is not installed: "
                             "pip install 'rlpost[lora]' (or peft), or set the rank to 0 and the path to null")
        if model_cfg.lora_adapter_path is not None:  # the saved adapter names its own target modules
            check_adapter_folder(str(model_cfg.lora_adapter_path), model_cfg, None, group)
        else:
            check_target_modules(model_cfg, group)


def check_model_families(config: Any) -> None:
    """Each model the run trains or scores can be right on the paths the config picks (packed rows, Ulysses, the
    fused head): `rlpost.utils.model_traits.path_refusals` on its config.json; a folder that transformers
    cannot read is reported where the model loads."""
    from rlpost.utils.model_traits import engine_refusal, load_metrics_refusal, path_refusals, replay_refusal

    arr = config.actor_rollout_ref
    groups = [("actor_rollout_ref.model", arr.model, "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
               max(int(arr.actor.ulysses_sequence_parallel_size), int(arr.ref.ulysses_sequence_parallel_size)),
               bool(arr.model.use_fused_kernels))]
    if need_critic(config):
        groups.append(("critic.model", config.critic.model, "critic.ulysses_sequence_parallel_size",
                       config.critic.ulysses_sequence_parallel_size, False))
    for group, model_cfg, sp_key, sp, fused in groups:
        traits = _traits_of(model_cfg)
        if traits is None:
            continue
        why = path_refusals(traits, group, model_cfg.use_remove_padding, sp_key, sp, fused)
        if group == "actor_rollout_ref.model":
            why += [r for r in [engine_refusal(traits, arr.rollout.name, config.trainer.device),
                                replay_refusal(traits, arr.actor.router_replay.mode),
                                load_metrics_refusal(traits, arr.rollout.moe_load_balance_metrics_interval)] if r]
        if why:
            raise ValueError(why[0])


def _traits_of(model_cfg: Any) -> Any:
    """`ModelTraits` of a model group's folder, or None when its config cannot be read here."""
    from rlpost.utils.import_utils import import_external_libs
    from rlpost.utils.model import load_hf_config
    from rlpost.utils.model_traits import model_traits

    path = os.path.expanduser(str(model_cfg.path))
    if not os.path.isfile(os.path.join(path, "config.json")):
        return None
    import_external_libs(model_cfg.external_lib)
    try:
        hf_config = load_hf_config(path, model_cfg.trust_remote_code, model_cfg.override_config)
    except (OSError, ValueError, KeyError):
        return None
    return model_traits(hf_config)


def check_output_folder(config: Any) -> None:
    """`trainer.default_local_dir` can hold checkpoints and logs: no file in its place, writable."""
    from rlpost.checkpoint.manager import unwritable_folder

    path = os.path.abspath(os.path.expanduser(config.trainer.default_local_dir))
    reason = unwritable_folder(path)
    if reason:
        raise ValueError(f"trainer.default_local_dir={path!r} cannot hold checkpoints and logs: {reason}")


def check_devices(config: Any) -> None:
    """One node: the devices `trainer.n_gpus_per_node` asks for exist here (else Ray would wait, then time out)."""
    trainer = config.trainer
    if trainer.nnodes != 1:
        return  # other nodes' devices are Ray's to count
    rollout = config.actor_rollout_ref.rollout
    split = 0 if config.actor_rollout_ref.hybrid_engine else rollout.nnodes * rollout.n_gpus_per_node
    want = trainer.n_gpus_per_node + split
    asked = f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}" + (
        f" + actor_rollout_ref.rollout.nnodes x n_gpus_per_node = {split} rollout = {want}" if split else "")
    if trainer.device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if have < want:
            raise ValueError(f"{asked}, but this machine has {have} CUDA device(s) visible; use "
                             f"{_fit(split, have)}"
                             + ("" if have else " (or trainer.device=cpu)"))
        return
    have = config.ray_init.num_cpus or os.cpu_count() or 1
    if have < want:
        raise ValueError(f"{asked} CPU worker processes (trainer.device=cpu), but Ray has {have} CPU(s) "
                         f"(ray_init.num_cpus or the machine's); use {_fit(split, have)}")


def _fit(split: int, have: int) -> str:
    """A device split that fits `have` devices."""
    if not split:
        return f"trainer.n_gpus_per_node={max(have, 1)}"
    if have >= 2:
        return (f"trainer.n_gpus_per_node={have - max(1, have // 2)} and actor_rollout_ref.rollout.n_gpus_per_node="
                f"{max(1, have // 2)} (rollout.nnodes=1)")
    return "actor_rollout_ref.hybrid_engine=true (trainer.n_gpus_per_node=1)"



def check_context_length(config: Any) -> None:
    """Prompt + response (or `rollout.max_model_len`) fits the policy model's context (`max_position_embeddings`,
    times a RoPE scaling factor) when the engine would refuse it (vLLM, SGLang) after the workers start."""
    import json

    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return  # the user asked the engine to run past the model's context
    rollout = config.actor_rollout_ref.rollout
    if rollout.name not in ("vllm", "sglang"):
        return  # the HF engine runs RoPE models past their trained context (badly, but it runs)
    model_file = os.path.join(os.path.expanduser(str(config.actor_rollout_ref.model.path)), "config.json")
    if not os.path.isfile(model_file):
        return  # a folder without config.json is reported where the model loads
    with open(model_file) as f:
        model_config = json.load(f)
    limit = model_config.get("max_position_embeddings")
    if not isinstance(limit, int):
        return
    scaling = model_config.get("rope_scaling") or {}
    limit = int(limit * float(scaling.get("factor") or 1.0))
    data = config.data
    want = rollout.max_model_len or int(data.max_prompt_length) + int(data.max_response_length)
    reserve = 0
    if rollout.name == "sglang":  # SGLang keeps SCHEDULER_RESERVE tokens of its context free
        from rlpost.rollout.sglang_args import SCHEDULER_RESERVE as reserve
        want = max(want, int(data.max_prompt_length) + int(data.max_response_length) + reserve)
    if want > limit:
        key = ("actor_rollout_ref.rollout.max_model_len" if rollout.max_model_len else
               "data.max_prompt_length + data.max_response_length")
        if reserve:
            key += f" (+ {reserve} tokens SGLang keeps free)"
        room = limit - int(data.max_prompt_length) - reserve
        fix = (f"lower data.max_response_length to <= {room} (or data.max_prompt_length)" if room > 0 else
               f"lower data.max_prompt_length and data.max_response_length to a sum <= {limit}")
        raise ValueError(f"{key} = {want} tokens is more than the model's context of {limit} "
                         f"(max_position_embeddings in {model_file}); {fix}")


def check_optimizers(config: Any) -> None:
    """Each trained model's `optim.optimizer` exists in `optim.optimizer_impl`, is a torch optimiser, and takes
    every constructor argument it will get (lr, weight_decay, betas for an Adam, `override_optimizer_config`)."""
    from rlpost.utils.optim import optimizer_kwargs

    groups = {"actor_rollout_ref.actor.optim": config.actor_rollout_ref.actor.optim}
    if need_critic(config):
        groups["critic.optim"] = config.critic.optim
    for key, optim in groups.items():
        optimizer_kwargs(optim, key)


def check_engine_kwargs(config: Any) -> None:
    """Every `rollout.engine_kwargs.vllm` key is an argument of the installed vLLM's engine (a typo would
    otherwise fail inside every worker after Ray starts)."""
    import difflib

    rollout = config.actor_rollout_ref.rollout
    extra = [k for k, v in dict(rollout.engine_kwargs.vllm or {}).items() if v is not None]
    if rollout.name == "vllm" and str(rollout.engine_kwargs.vllm.get("enable_expert_parallel")).lower() == "true":
        key = "actor_rollout_ref.rollout.engine_kwargs.vllm.enable_expert_parallel=true"
        why = ("vLLM's CPU fused-MoE kernel crashes the worker with it (a segfault in cpu_fused_moe.cpp, seen on "
               "a tiny Qwen3-MoE at TP 2)" if config.trainer.device == "cpu" else
               "the weight sync into expert-parallel shards has not been checked on a GPU yet")
        raise ValueError(f"not supported yet: {key}: {why}; leave it unset (each expert is then split over the "
                         "tensor-parallel ranks)")
    if rollout.name != "vllm" or not extra or importlib.util.find_spec("vllm") is None:
        return
    from dataclasses import fields

    import vllm

    accepted = {f.name for f in fields(vllm.EngineArgs)} | {"seed"}
    for key in extra:
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(f"actor_rollout_ref.rollout.engine_kwargs.vllm.{key}: not an argument of vLLM "
                             f"{vllm.__version__}'s engine; {hint}the accepted names are the fields of "
                             "vllm.EngineArgs")


def device_memory_bytes(config: Any) -> tuple[int | None, str]:
    """(bytes per device the memory estimate checks against, where that number came from).

    `trainer.device_memory_gb` when set; else on GPU the total memory of the first visible device, read
    through NVML so this process (the Ray driver) creates no CUDA context on it; else (CPU) None.
    """
    trainer = config.trainer
    if trainer.device_memory_gb is not None:
        return int(float(trainer.device_memory_gb) * 2**30), f"trainer.device_memory_gb={trainer.device_memory_gb}"
    if trainer.device != "cuda":
        return None, "CPU run"
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(visible)) if visible.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(visible))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), "NVML total memory of the first visible GPU"
    except Exception:  # no NVML bindings or driver: ask the CUDA runtime (creates a context here)
        import torch

        return int(torch.cuda.mem_get_info(0)[1]), "torch.cuda.mem_get_info of GPU 0"


def check_memory(typed: Any) -> None:
    """Print the per-phase memory estimate and refuse a run whose estimate cannot fit the device.

    Args:
        typed: the typed `ppo_trainer` config.

    Raises:
        ValueError (`ConfigError`): a phase does not fit; names the knob and a value that fits.
    """
    from rlpost.trainer.config.memory import check_memory_fit, memory_lines, run_memory

    device_bytes, where = device_memory_bytes(typed)
    if device_bytes is None:
        return
    mem = run_memory(typed)
    if mem is None:
        return
    print("\n".join(memory_lines(typed, device_bytes)))
    check_memory_fit(mem, device_bytes, where)


def estimate_metrics(typed: Any) -> dict[str, float]:
    """`{perf/estimated_memory_gb/<phase>: GiB}` per device, logged beside the measured per-phase peaks
    (`perf/max_memory_allocated_gb/<phase>`); empty on CPU or without a config.json."""
    from rlpost.trainer.config.memory import run_memory

    device_bytes, _ = device_memory_bytes(typed)
    mem = run_memory(typed) if device_bytes is not None and typed.trainer.device == "cuda" else None
    if mem is None:
        return {}
    return {f"perf/estimated_memory_gb/{p.phase}": p.total / 2**30 for p in mem.phases(device_bytes)}


def dry_run_model_notes(config: Any) -> list[str]:
    """The dry run's look at the model folders: a folder here that is damaged raises as a run would; a folder
    not on this machine (the plan may be for another one) is returned as a note naming the key.

    Raises:
        ValueError: a model folder on this machine whose config.json or weights are broken.
    """
    from rlpost.utils.model_files import weight_files

    notes = []
    for key, path in model_folders(config).items():
        folder = os.path.expanduser(str(path))
        if os.path.isdir(folder):
            has_weights = bool(weight_files(folder))
            check_model_folder(key, str(path), weights=has_weights)  # broken files raise as a run would
            if not has_weights:  # config.json alone sizes a plan (e.g. for a GPU machine): said, not refused
                notes.append(f"{key}={path!r} holds config.json but no weights: the plan above is computed from "
                             "it; a run stops at start-up until the weights are there")
        else:
            notes.append(f"{missing_folder(key, path)}. A run on this machine stops there at start-up; the plan "
                         "above holds for a machine that has the folder")
    return notes
