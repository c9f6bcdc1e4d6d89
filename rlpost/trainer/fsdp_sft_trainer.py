"""Supervised fine-tuning with FSDP2: loss on response tokens only, HF checkpoints out.

Launch (config: rlpost/trainer/config/sft_trainer.yaml):
    torchrun --nproc_per_node=2 -m rlpost.trainer.fsdp_sft_trainer \
        data.train_files=train.parquet data.prompt_key=prompt data.response_key=response \
        model.partial_pretrain=/path/to/hf_model trainer.default_local_dir=ckpts
    python -m rlpost.trainer.fsdp_sft_trainer ...   # one plain process (world size 1)

Checkpoints: `<default_local_dir>/global_step_<N>/` holds config, tokenizer and safetensors, loadable
with `AutoModelForCausalLM.from_pretrained` (a vision-language model: `AutoModelForImageTextToText`, with its
processor files).

With `data.image_key` (verl's multi-modal rows, a Qwen2-VL-family model) each micro-batch gives the model its
rows' pixels and the 3-D rotary positions of `rlpost.engine.vision`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.utils.data import DataLoader, DistributedSampler

from rlpost.config.constraints import check_fields
from rlpost.config.convert import to_typed_root
from rlpost.config.schema_sft import SFTTrainerConfig
from rlpost.data.sft_dataset import SFTDataset, collate
from rlpost.keys import ATTENTION_MASK, IMAGE_MASK, INPUT_IDS, LOSS_MASK, MULTI_MODAL_INPUTS, POSITION_IDS
from rlpost.trainer.config.rules import check_liger_run
from rlpost.checkpoint.manager import prune_oldest
from rlpost.utils.distributed import free_port, init_distributed
from rlpost.engine.fsdp import apply_fsdp2, clip_grad_norm, iter_full_params
from rlpost.engine.liger import apply_liger
from rlpost.engine.vision import model_kwargs, real_placeholders, vision_inputs
from rlpost.utils.tracking import StepProgress, Tracking
from rlpost.utils.optim import lr_schedule, build_optimizer

LR_SCHEDULERS = ("cosine", "wsd")

# Keys of sft_trainer.yaml that are in scope but not built yet: value must stay at this default.
UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "ulysses_sequence_parallel_size": 1,
    "use_remove_padding": False,
    "data.balance_dp_token": False,
    "data.multiturn.enable": False,
    "data.custom_cls.path": None,
    "data.use_shm": False,
    "model.use_shm": False,
    "model.lora_rank": 0,
    "model.external_lib": None,
    "model.fsdp_config.cpu_offload": False,
    "model.fsdp_config.offload_params": False,
    "trainer.default_hdfs_dir": None,
    "trainer.resume_path": None,
}


def sft_config(config: DictConfig | SFTTrainerConfig) -> SFTTrainerConfig:
    """The SFT config in typed form (converted once; every value checked against its field's constraint).

    Raises:
        ConfigError: a missing, unknown or mistyped key, named. ValueError: a value outside its range.
    """
    if isinstance(config, SFTTrainerConfig):
        return config
    typed = to_typed_root(config, SFTTrainerConfig)
    check_fields(typed)
    return typed


def check_sft_config(config: DictConfig | SFTTrainerConfig, world_size: int, device: str) -> None:
    """Fail fast on unsupported keys, on batch sizes that do not divide and on a Liger run that cannot work
    (`device` is the resolved trainer.device); errors name the key."""
    config = sft_config(config)
    for key, default in UNSUPPORTED_DEFAULTS.items():
        value = config.select(key)
        if value != default and not (default is False and value in (None, 0)):
            raise NotImplementedError(f"not supported yet: {key}={value!r} (leave it at {default!r})")
    sched = config.optim.lr_scheduler
    if sched not in LR_SCHEDULERS:
        raise ValueError(f"optim.lr_scheduler={sched!r} must be one of {LR_SCHEDULERS}; nearest valid: 'cosine'")
    batch, unit = config.data.train_batch_size, config.data.micro_batch_size_per_gpu * world_size
    if batch % unit:
        raise ValueError(
            f"data.train_batch_size={batch} must be a multiple of data.micro_batch_size_per_gpu x world size "
            f"= {unit}; nearest valid: {max(unit, round(batch / unit) * unit)}"
        )
    if config.model.use_liger:
        check_liger_run("model.use_liger", device, "model.partial_pretrain", config.model.partial_pretrain)


def resolve_device(config: DictConfig | SFTTrainerConfig) -> str:
    """`trainer.device` (cpu | cuda; default cuda when available), refusing cuda without a GPU."""
    device = sft_config(config).trainer.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"trainer.device={device!r} must be 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but no CUDA device is visible; set trainer.device=cpu")
    return device


def _init_process_group(device: str) -> None:
    """Join the torchrun group, or form a group of one when RANK is unset (plain `python -m`)."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    init_distributed(device)


def _wsd_scheduler(optimizer: torch.optim.Optimizer, warmup: int, total: int):
    """Warmup-stable-decay: linear warmup, flat LR, cosine decay to 0 over the last 10% of steps."""
    from transformers import get_wsd_schedule

    decay = max(1, int(0.1 * max(total - warmup, 1)))
    return get_wsd_schedule(optimizer, num_warmup_steps=warmup, num_decay_steps=decay, num_training_steps=total)


class FSDPSFTTrainer:
    """SFT loop over an FSDP2-sharded HF causal LM.

    Args:
        config: The full sft_trainer config (groups data, model, optim, trainer).
        tokenizer: HF tokenizer (or, for a vision-language model, its processor) saved next to every checkpoint.
        train_dataset: Items as produced by `SFTDataset` (input_ids, attention_mask, position_ids,
            loss_mask; each (L,)).
        val_dataset: Same layout, or None for no validation.
    """

    def __init__(self, config: DictConfig | SFTTrainerConfig, tokenizer, train_dataset, val_dataset=None) -> None:
        self.config = config = sft_config(config)
        self.tokenizer = tokenizer
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = resolve_device(config)
        check_sft_config(config, self.world_size, self.device)
        _warn_on_world_mismatch(config, self.world_size, self.rank)
        torch.manual_seed(config.trainer.seed)
        self.micro = config.data.micro_batch_size_per_gpu
        self.train_loader = self._loader(train_dataset, config.data.train_batch_size, shuffle=True)
        self.val_loader = None
        if val_dataset is not None and len(val_dataset) > 0:
            self.val_loader = self._loader(val_dataset, self.micro * self.world_size, shuffle=False)
        steps = len(self.train_loader) * config.trainer.total_epochs
        self.total_steps = config.trainer.total_training_steps or steps
        self.model = self._build_model()
        self.optimizer, self.lr_scheduler = self._build_optimizer()

    def _loader(self, dataset, global_batch: int, shuffle: bool) -> DataLoader:
        sampler = DistributedSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=shuffle,
            seed=self.config.trainer.seed, drop_last=True,
        )
        if len(dataset) < global_batch:
            raise ValueError(f"dataset has {len(dataset)} rows < one global batch of {global_batch}")
        return DataLoader(dataset, batch_size=global_batch // self.world_size, sampler=sampler, drop_last=True,
                          collate_fn=collate)

    def _build_model(self) -> torch.nn.Module:
        """Load the HF model in fp32, put Liger's kernels in (`model.use_liger`), enable checkpointing, shard it
        through rlpost.engine.fsdp."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

        model_cfg = self.config.model
        hf_config = AutoConfig.from_pretrained(model_cfg.partial_pretrain,
                                               trust_remote_code=model_cfg.trust_remote_code)
        vision = getattr(hf_config, "vision_config", None) is not None
        model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_pretrained(
            model_cfg.partial_pretrain, dtype=torch.float32,
            trust_remote_code=model_cfg.trust_remote_code,
        )
        if model_cfg.use_liger:
            apply_liger(model, key="model.use_liger")
        if model_cfg.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # compute dtype: fp32 on CPU, bf16 on CUDA (rlpost.engine.fsdp.compute_dtype); fp32 masters
        return apply_fsdp2(model, self.device, fsdp_size=-1, reshard_after_forward=True, offload_policy=False,
                           min_num_params=0)

    def _build_optimizer(self):
        optim = self.config.optim
        optimizer = build_optimizer(self.model.parameters(), optim)
        warmup = int(optim.warmup_steps_ratio * self.total_steps)
        if optim.lr_scheduler == "wsd":
            return optimizer, _wsd_scheduler(optimizer, warmup, self.total_steps)
        return optimizer, lr_schedule(optimizer, "cosine", warmup, self.total_steps, optim.min_lr_ratio, 0.5)

    def _loss_sum(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed next-token NLL over response tokens of a micro batch (b, L); returns (sum, n_tokens)."""
        ids, attn = micro[INPUT_IDS].to(self.device), micro[ATTENTION_MASK].to(self.device)
        inputs = {"position_ids": micro[POSITION_IDS].to(self.device)}
        vision: dict[str, torch.Tensor] = {}
        if MULTI_MODAL_INPUTS in micro:  # pixels, grids and 3-D positions (3, b, L) replace the 1-D positions
            rows = micro[MULTI_MODAL_INPUTS]
            vision = vision_inputs(self.model, ids, attn, torch.arange(len(rows)), rows)
            inputs.update(model_kwargs(vision))
        with real_placeholders(self.model, vision.get(IMAGE_MASK)):
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False, **inputs).logits  # (b, L, V)
        mask = micro[LOSS_MASK][:, 1:].to(self.device).float()  # (b, L-1): targets that are response
        nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
        return (nll * mask).sum(), mask.sum()

    def _all_reduce(self, value: torch.Tensor) -> torch.Tensor:
        value = value.detach().to(self.device, torch.float32).clone()
        dist.all_reduce(value)
        return value

    def training_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One optimizer step over this rank's share (n, L) of the global batch; returns metrics.

        The loss is the mean over all response tokens of the global batch: each micro batch divides
        its sum by the global token count; times world size because FSDP averages gradients.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens = self._all_reduce(batch[LOSS_MASK][:, 1:].sum()).clamp(min=1)
        total = torch.zeros((), device=self.device)
        for start in range(0, batch[INPUT_IDS].shape[0], self.micro):
            micro = {k: v[start : start + self.micro] for k, v in batch.items()}
            loss_sum, _ = self._loss_sum(micro)
            (loss_sum * self.world_size / n_tokens).backward()
            total += loss_sum.detach()
        grad_norm = clip_grad_norm(self.model, self.config.optim.clip_grad)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        elif self.rank == 0:
            print(f"warning: grad_norm={grad_norm.item()} is not finite, step skipped")
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        loss = self._all_reduce(total) / n_tokens
        return {"train/loss": loss.item(), "train/lr": lr, "train/grad_norm": float(grad_norm)}

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Token-mean response loss over the validation set (all ranks)."""
        self.model.eval()
        total = torch.zeros((), device=self.device)
        count = torch.zeros((), device=self.device)
        for batch in self.val_loader:
            loss_sum, n = self._loss_sum(batch)
            total, count = total + loss_sum, count + n
        return {"val/loss": (self._all_reduce(total) / self._all_reduce(count).clamp(min=1)).item()}

    def save_checkpoint(self, step: int) -> Path:
        """Gather full tensors to rank 0 and write a HF folder `global_step_<step>`."""
        root = Path(self.config.trainer.default_local_dir)
        path = root / f"global_step_{step}"
        # every rank takes part in each gather; only rank 0 keeps a CPU copy
        state = {name: full.cpu() for name, full in iter_full_params(self.model) if self.rank == 0}
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(str(path), state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(str(path))
            self._drop_old_checkpoints(root)
        dist.barrier()
        return path

    def _drop_old_checkpoints(self, root: Path) -> None:
        found = sorted(root.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
        prune_oldest(found, self.config.trainer.max_ckpt_to_keep)

    def fit(self) -> list[dict[str, float]]:
        """Run `total_steps` optimizer steps; log, validate and save on schedule; return per-step metrics."""
        trainer_cfg = self.config.trainer
        logger = _make_logger(self.config) if self.rank == 0 else None
        save_freq, test_freq = trainer_cfg.save_freq, trainer_cfg.test_freq
        history, step = [], 0
        bar = StepProgress(self.total_steps, disable=self.rank != 0)
        for epoch in range(math.ceil(self.total_steps / max(len(self.train_loader), 1))):
            self.train_loader.sampler.set_epoch(epoch)
            for batch in self.train_loader:
                step += 1
                metrics = self.training_step(batch)
                last = step >= self.total_steps
                if self.val_loader is not None and (last or (test_freq > 0 and step % test_freq == 0)):
                    metrics.update(self.validate())
                if last or (save_freq > 0 and step % save_freq == 0):
                    self.save_checkpoint(step)
                if logger is not None:
                    logger.log(metrics, step=step)
                history.append(metrics)
                bar.update(1, metrics)
                if last:
                    break
            if step >= self.total_steps:
                break
        bar.close()
        if logger is not None:
            logger.finish()
        return history


def _warn_on_world_mismatch(config: SFTTrainerConfig, world_size: int, rank: int) -> None:
    """The launcher (torchrun) decides the process count; say so when nnodes x n_gpus_per_node differs."""
    planned = config.trainer.nnodes * config.trainer.n_gpus_per_node
    if rank == 0 and planned != world_size:
        print(f"warning: trainer.nnodes x trainer.n_gpus_per_node = {planned} but the launcher "
              f"started {world_size} process(es); training uses {world_size} (set by torchrun --nproc_per_node)")


def _make_logger(config: SFTTrainerConfig):
    """rlpost.utils.tracking.Tracking with the trainer's project/experiment/logger settings."""
    trainer_cfg = config.trainer
    return Tracking(
        project_name=trainer_cfg.project_name,
        experiment_name=trainer_cfg.experiment_name,
        default_backend=list(trainer_cfg.logger),
        config=config.to_dict(),
        log_dir=trainer_cfg.default_local_dir,
    )


def run_sft(config: DictConfig | SFTTrainerConfig) -> list[dict[str, float]]:
    """Build tokenizer, datasets and trainer from `config`, train, return per-step metrics."""
    from transformers import AutoTokenizer

    config = sft_config(config)  # converted and checked once, before any process group or model
    owns_group = not dist.is_initialized()  # never tear down a group someone else started
    _init_process_group(resolve_device(config))
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            config.model.partial_pretrain, trust_remote_code=config.model.trust_remote_code
        )
        if config.data.chat_template:
            tokenizer.chat_template = config.data.chat_template
        processor = None
        if config.data.image_key is not None:
            from rlpost.utils.tokenizer import hf_processor

            processor = hf_processor(config.model.partial_pretrain, trust_remote_code=config.model.trust_remote_code)
        train = SFTDataset(config.data.train_files, tokenizer, config.data, processor)
        val = SFTDataset(config.data.val_files, tokenizer, config.data, processor) if config.data.val_files else None
        return FSDPSFTTrainer(config, processor or tokenizer, train, val).fit()
    finally:
        if owns_group:
            dist.destroy_process_group()


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Hydra entry point: `python -m rlpost.trainer.fsdp_sft_trainer key=value ...`."""
    run_sft(config)


if __name__ == "__main__":
    main()
