"""Helpers for the worker tests: a fixed batch, configs composed from ppo_trainer.yaml, a 2-process launcher."""

from __future__ import annotations

import faulthandler
import os
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp
from _compose import SMALL, compose_config, typed_config_of
from rlpost.utils.distributed import free_port
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


# The worker-test setup on top of `_compose.SMALL`: 8 prompts x n=1 per step, mini-batch 4 (2 rows per rank),
# micro-batch 2, a fast learning rate. The rollout engine is `hf` unless a test registers its own first.
WORKER = (
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64", "actor_rollout_ref.actor.data_loader_seed=0",
    "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3", "actor_rollout_ref.ref.fsdp_config.param_offload=true",
    "critic.ppo_mini_batch_size=8", "critic.forward_micro_batch_size_per_gpu=4", "critic.ppo_max_token_len_per_gpu=64",
    "critic.model.use_remove_padding=true", "critic.model.enable_gradient_checkpointing=true",
    "critic.optim.lr=1e-3", "critic.optim.weight_decay=0.0", "critic.optim.lr_warmup_steps=1",
)


def _overrides(model_dir: str, rollout: str) -> tuple[str, ...]:
    paths = (f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}",
             f"reward_model.model.path={model_dir}", f"actor_rollout_ref.rollout.name={rollout}")
    return (*SMALL, *WORKER, *paths)


def full_config(model_dir: str, *overrides: str, rollout: str = "hf"):
    """The validated `ppo_trainer` config (DictConfig) of the worker tests on `model_dir` (every model path
    points there)."""
    return compose_config(*_overrides(model_dir, rollout), *overrides)


def typed_full_config(model_dir: str, *overrides: str, rollout: str = "hf"):
    """The same config as the typed dataclasses (`PPOTrainerConfig`) the trainer may hand workers."""
    return typed_config_of(*_overrides(model_dir, rollout), *overrides)


def arr_config(model_dir: str, *overrides: str, rollout: str = "hf"):
    """`actor_rollout_ref` group (DictConfig) of `full_config`."""
    return full_config(model_dir, *overrides, rollout=rollout).actor_rollout_ref




def shard_of(batch: dict, rank: int, world: int, **extra):
    """This rank's contiguous share of the rows (what DP_COMPUTE_PROTO hands each rank), temperature 0.7."""
    from rlpost.protocol import DataProto

    n = next(iter(batch.values())).shape[0] // world
    tensors = {k: v[rank * n:(rank + 1) * n].clone() for k, v in {**batch, **extra}.items()}
    return DataProto.from_dict(tensors=tensors, meta_info={keys.META_TEMPERATURE: 0.7})


def gather_all(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t`, concatenated in rank order (the trainer's view of a DP_COMPUTE_PROTO result)."""
    import torch.distributed as dist

    parts = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


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
            mp.spawn(_entry, args=(world, free_port(), fn, args, err_dir), nprocs=world, join=True)
            return
        except mp.ProcessExitedException as exc:
            errs = _read_reports(err_dir, "err_")
            if errs or exc.signal_name is None or attempt == 2:
                raise AssertionError(errs or f"{exc}\n{_read_reports(err_dir, 'fault_')}") from exc
            warnings.warn(f"rank {exc.error_index} died by {exc.signal_name} without a Python error; "
                          f"retrying once. Native stacks:\n{_read_reports(err_dir, 'fault_')}", stacklevel=2)
        except Exception as exc:
            raise AssertionError(_read_reports(err_dir, "err_") or str(exc)) from exc
