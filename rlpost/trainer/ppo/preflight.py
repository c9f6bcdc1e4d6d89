"""Checks of the run's inputs that need the file system or the machine, made before any worker starts.

The config itself is validated earlier (`rlpost.trainer.config`); here: every model folder the run loads,
the data files, and whether this machine has the devices the config asks for. Each failure is one
`ValueError` naming the key, the value and what to use instead.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from rlpost.trainer.config.roles import need_critic


def check_model_and_data_paths(config: Any) -> None:
    """Every model folder (policy, critic, reward model) and data file the run will read exists."""
    folders = {"actor_rollout_ref.model.path": config.actor_rollout_ref.model.path}
    if need_critic(config):
        folders["critic.model.path"] = config.critic.model.path
    if config.reward_model.enable:
        folders["reward_model.model.path"] = config.reward_model.model.path
    for key, path in folders.items():
        if not os.path.isdir(os.path.expanduser(str(path))):
            raise ValueError(f"{key}={path!r} is not a local folder; no model hub is used at run time: point it at "
                             "a HF model folder (config.json + weights), e.g. one made by scripts/make_tiny_model.py")
    for key in ("data.train_files", "data.val_files"):
        files = config.data[key.split(".")[1]]
        for path in [files] if isinstance(files, str) else list(files or []):
            if not os.path.isfile(os.path.expanduser(str(path))):
                raise ValueError(f"{key}: file not found: {path!r}; give the parquet file(s) of your data, e.g. "
                                 "made by examples/data_preprocess/gsm8k.py")


def check_lora_inputs(config: Any) -> None:
    """With LoRA on: `target_modules` select layers of the model, and a `lora_adapter_path` is an adapter folder
    of the configured rank (its layer shapes are checked when the workers load it)."""
    from rlpost.utils.lora import check_adapter_folder, check_target_modules, lora_enabled

    groups = {"actor_rollout_ref.model": config.actor_rollout_ref.model}
    if need_critic(config):
        groups["critic.model"] = config.critic.model
    for group, model_cfg in groups.items():
        if not lora_enabled(model_cfg):
            continue
        if importlib.util.find_spec("peft") is None:
            raise ValueError(f"{group}.lora_rank={model_cfg.lora_rank} needs PEFT, which is not installed: "
                             "pip install 'rlpost[lora]' (or peft), or set the rank to 0")
        check_target_modules(model_cfg, group)
        if model_cfg.lora_adapter_path is not None:
            check_adapter_folder(str(model_cfg.lora_adapter_path), model_cfg, None, group)


def check_output_folder(config: Any) -> None:
    """`trainer.default_local_dir` can hold checkpoints and logs: no file in its place, writable."""
    from rlpost.utils.checkpoint import unwritable_folder

    path = os.path.abspath(os.path.expanduser(str(config.trainer.default_local_dir)))
    reason = unwritable_folder(path)
    if reason:
        raise ValueError(f"trainer.default_local_dir={path!r} cannot hold checkpoints and logs: {reason}")


def check_devices(config: Any) -> None:
    """One node: the devices `trainer.n_gpus_per_node` asks for exist here (else Ray would wait, then time out)."""
    trainer = config.trainer
    if trainer.nnodes != 1:
        return  # other nodes' devices are Ray's to count
    want = trainer.n_gpus_per_node
    if trainer.device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if have < want:
            raise ValueError(f"trainer.n_gpus_per_node={want}, but this machine has {have} CUDA device(s) "
                             f"visible; use trainer.n_gpus_per_node={max(have, 1)}"
                             + ("" if have else " (or trainer.device=cpu)"))
        return
    have = config.ray_init.num_cpus or os.cpu_count() or 1
    if have < want:
        raise ValueError(f"trainer.n_gpus_per_node={want} CPU worker processes (trainer.device=cpu), but Ray has "
                         f"{have} CPU(s) (ray_init.num_cpus or the machine's); use trainer.n_gpus_per_node={have}")


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
