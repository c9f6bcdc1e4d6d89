"""Helpers for the worker tests: a fixed batch, configs shaped like ppo_trainer.yaml, a 2-process launcher."""

from __future__ import annotations

import faulthandler
import os
import socket
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from rlpost import keys

P, R, B = 6, 5, 8


def make_batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """B rows: left-padded prompts (P) and right-padded responses (R) of varying lengths."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (B, P), generator=g)
    responses = torch.randint(3, vocab, (B, R), generator=g)
    p_len = torch.tensor([6, 3, 5, 2, 6, 4, 1, 5])
    r_len = torch.tensor([5, 2, 4, 5, 1, 3, 5, 2])
    p_mask = (torch.arange(P)[None] >= (P - p_len)[:, None]).long()
    r_mask = (torch.arange(R)[None] < r_len[:, None]).long()
    prompts = prompts * p_mask
    responses = responses * r_mask
    attn = torch.cat([p_mask, r_mask], dim=1)
    return {
        keys.PROMPTS: prompts, keys.RESPONSES: responses, keys.RESPONSE_MASK: r_mask,
        keys.INPUT_IDS: torch.cat([prompts, responses], dim=1), keys.ATTENTION_MASK: attn,
        keys.POSITION_IDS: (attn.cumsum(-1) - 1).clamp(min=0),
    }


def fsdp_cfg(**over: Any) -> dict:
    cfg = {"param_offload": False, "optimizer_offload": False, "offload_policy": False,
           "reshard_after_forward": True, "fsdp_size": -1, "wrap_policy": {"min_num_params": 0}}
    cfg.update(over)
    return cfg


def arr_config(model_dir: str, **actor_over: Any):
    """`actor_rollout_ref` subtree with the keys the worker reads."""
    actor = {
        "strategy": "fsdp2", "ppo_mini_batch_size": 4, "ppo_micro_batch_size": None,
        "ppo_micro_batch_size_per_gpu": 2, "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 64,
        "ppo_epochs": 1, "shuffle": False, "data_loader_seed": 0, "clip_ratio": 0.2, "entropy_coeff": 0.0,
        "use_kl_loss": False, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "loss_agg_mode": "token-mean",
        "grad_clip": 1.0, "ulysses_sequence_parallel_size": 1, "use_torch_compile": False,
        "policy_loss": {"loss_mode": "vanilla"},
        "optim": {"lr": 1e-2, "weight_decay": 0.0, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0,
                  "warmup_style": "constant", "total_training_steps": 10},
        "fsdp_config": fsdp_cfg(),
    }
    actor.update(actor_over)
    return OmegaConf.create({
        "model": {"path": model_dir, "use_remove_padding": False, "enable_gradient_checkpointing": False,
                  "override_config": {}, "external_lib": None, "trust_remote_code": False},
        "actor": actor,
        "rollout": {"name": "recording", "n": 1, "temperature": 0.7, "dtype": "bfloat16", "free_cache_engine": True,
                    "log_prob_micro_batch_size_per_gpu": 2, "log_prob_use_dynamic_bsz": False,
                    "log_prob_max_token_len_per_gpu": 64},
        "ref": {"strategy": "fsdp2", "log_prob_micro_batch_size_per_gpu": 3, "log_prob_use_dynamic_bsz": False,
                "log_prob_max_token_len_per_gpu": 64, "fsdp_config": fsdp_cfg(param_offload=True)},
    })


def critic_config(model_dir: str):
    return OmegaConf.create({
        "strategy": "fsdp2", "ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2,
        "forward_micro_batch_size_per_gpu": 4, "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 64,
        "forward_max_token_len_per_gpu": 64, "ppo_epochs": 1, "shuffle": False, "cliprange_value": 0.5,
        "loss_agg_mode": "token-mean", "grad_clip": 1.0,
        "model": {"path": model_dir, "use_remove_padding": True, "enable_gradient_checkpointing": True,
                  "override_config": {}, "trust_remote_code": False, "fsdp_config": fsdp_cfg()},
        "optim": {"lr": 1e-3, "weight_decay": 0.0, "lr_warmup_steps": 1, "warmup_style": "constant",
                  "total_training_steps": 10},
    })


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, err_dir: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RLPOST_DEVICE": "cpu"})
    torch.set_num_threads(1)
    # A native crash (SIGABRT/SIGSEGV) leaves no Python traceback; faulthandler writes each thread's stack here.
    fault_file = open(os.path.join(err_dir, f"fault_{rank}.txt"), "w")  # noqa: SIM115 (open until exit)
    faulthandler.enable(file=fault_file, all_threads=True)
    try:
        fn(rank, *args)
    except BaseException:
        with open(os.path.join(err_dir, f"err_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _read_reports(err_dir: str, prefix: str) -> str:
    texts = [(p.name, p.read_text()) for p in sorted(Path(err_dir).glob(f"{prefix}*"))]
    return "\n".join(f"--- {name}\n{text}" for name, text in texts if text.strip())


def spawn(fn: Callable, args: tuple, err_dir: str, world: int = 2) -> None:
    """Run `fn(rank, *args)` in `world` processes; re-raise the first rank's traceback.

    A rank killed by a signal with no Python error (a native crash inside gloo/torch, seen rarely on the
    2-core CI machine) is reported with its faulthandler stacks and the run is tried once more; a Python
    error, or a second crash, fails the test."""
    for attempt in (1, 2):
        for name in os.listdir(err_dir):
            if name.startswith(("err_", "fault_")):
                os.remove(os.path.join(err_dir, name))
        try:
            mp.spawn(_entry, args=(world, _free_port(), fn, args, err_dir), nprocs=world, join=True)
            return
        except mp.ProcessExitedException as exc:
            errs = _read_reports(err_dir, "err_")
            if errs or exc.signal_name is None or attempt == 2:
                raise AssertionError(errs or f"{exc}\n{_read_reports(err_dir, 'fault_')}") from exc
            warnings.warn(f"rank {exc.error_index} died by {exc.signal_name} without a Python error; "
                          f"retrying once. Native stacks:\n{_read_reports(err_dir, 'fault_')}", stacklevel=2)
        except Exception as exc:
            raise AssertionError(_read_reports(err_dir, "err_") or str(exc)) from exc
