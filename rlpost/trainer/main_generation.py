"""Offline generation: n sampled responses per chat prompt of a parquet file, written back to parquet.

Launch (config: rlpost/trainer/config/generation.yaml):
    python -m rlpost.trainer.main_generation data.path=test.parquet data.prompt_key=prompt \
        data.n_samples=4 data.output_path=out.parquet model.path=/path/to/hf_model rollout.name=vllm

The output holds every input column plus `responses`: a list of `data.n_samples` strings per row.
With one device, this process drives one engine (vLLM, SGLang or HF `generate`, chosen by rollout.name).
With `trainer.nnodes x trainer.n_gpus_per_node` > 1 devices, one Ray worker per device holds an engine
(`ActorRolloutRefWorker` with role `rollout`) and each batch of prompts is split across them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import hydra
import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rlpost import keys
from rlpost.config.constraints import check_fields
from rlpost.config.schema_generation import GenerationConfig
from rlpost.config.schema_workers import ActorRolloutRefConfig
from rlpost.protocol import DataProto
from rlpost.rollout import build_rollout

OUTPUT_COLUMN = "responses"

# Keys of generation.yaml that are in scope but not built yet: value must stay at this default.
UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "model.external_lib": None,
    "rollout.mode": "sync",
    "rollout.n": 1,
}


def generation_config(config: DictConfig | GenerationConfig) -> GenerationConfig:
    """The generation config in typed form, converted once (keys named as generation.yaml spells them)."""
    from rlpost.config.convert import to_typed_root

    if isinstance(config, GenerationConfig):
        return config
    typed = to_typed_root(config, GenerationConfig)
    check_fields(typed)
    return typed


def check_generation_config(config: DictConfig | GenerationConfig) -> None:
    """Fail fast on keys this tool does not build and on inconsistent sampling."""
    config = generation_config(config)
    for key, default in UNSUPPORTED_DEFAULTS.items():
        value = config.select(key)
        if value is not None and value != default:
            hint = " (use data.n_samples for several responses per prompt)" if key == "rollout.n" else ""
            raise NotImplementedError(f"not supported yet: {key}={value!r} (leave it at {default!r}){hint}")
    n, sampling = config.data.n_samples, worker_config(config).rollout
    if (not sampling.do_sample or sampling.temperature <= 0) and n > 1:
        raise ValueError(
            f"data.n_samples={n} with greedy decoding (rollout.temperature=0 or do_sample=false) gives n "
            "identical responses; set rollout.temperature > 0 or data.n_samples=1"
        )


def num_devices(config: DictConfig | GenerationConfig) -> int:
    """trainer.nnodes x trainer.n_gpus_per_node (worker processes on cpu)."""
    devices = generation_config(config).trainer
    return devices.nnodes * devices.n_gpus_per_node


def build_engine(config: GenerationConfig, tokenizer, device: str):
    """An object with `generate_sequences(DataProto)`: an engine here, or a Ray group of rollout workers."""
    worker_cfg = worker_config(config)
    if num_devices(config) == 1:
        return build_rollout(worker_cfg.rollout, worker_cfg.model.path, tokenizer, device)
    from rlpost.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray
    from rlpost.workers.fsdp_workers import ActorRolloutRefWorker

    init_ray(config.ray_init)
    pool = RayResourcePool([config.trainer.n_gpus_per_node] * config.trainer.nnodes,
                           use_gpu=device == "cuda", name_prefix="generation")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=worker_cfg, role="rollout"))
    group.init_model()
    return group


def worker_config(config: DictConfig | GenerationConfig) -> ActorRolloutRefConfig:
    """The typed `actor_rollout_ref` group a rollout worker reads: generation.yaml's `model` and `rollout` keys
    over the packaged policy defaults (generation.yaml holds only what it changes), checked once, keys named as
    generation.yaml spells them.

    `dummy_*` load formats mean "weights arrive from the trainer"; with no trainer here they come
    from the checkpoint on disk instead, which is what such a config asks for in the end.
    """
    from rlpost.config.convert import typed_group
    from rlpost.config.defaults import default_of

    config = generation_config(config)
    merged = OmegaConf.merge(OmegaConf.create(default_of("actor_rollout_ref")),
                             {"model": config.model, "rollout": config.rollout})
    if str(merged.rollout.load_format).startswith("dummy"):
        merged.rollout.load_format = "auto"
    return typed_group(merged, ActorRolloutRefConfig, "")


def build_prompt_batch(chats: Sequence[Any], tokenizer, max_prompt_length: int) -> DataProto:
    """Chat-template and left-pad a list of chats.

    Args:
        chats: B chats (lists of {"role", "content"}) or plain strings (one user turn).
        tokenizer: HF tokenizer with a chat template and a pad token.
        max_prompt_length: rollout.prompt_length; a longer templated prompt raises.

    Returns:
        DataProto with `input_ids`, `attention_mask`, `position_ids` (B, P), P = longest prompt;
        meta_info `eos_token_id`, `pad_token_id`.
    """
    rows = []
    for i, chat in enumerate(chats):
        messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else [dict(m) for m in chat]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_length:
            raise ValueError(f"prompt {i} has {len(ids)} tokens > rollout.prompt_length={max_prompt_length}")
        rows.append(ids)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, width - len(ids) :] = 1
    position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: input_ids, keys.ATTENTION_MASK: attention_mask, keys.POSITION_IDS: position_ids},
        meta_info={keys.META_EOS_TOKEN_ID: tokenizer.eos_token_id, keys.META_PAD_TOKEN_ID: tokenizer.pad_token_id},
    )


def decode_responses(output: DataProto, tokenizer) -> list[str]:
    """Text of each row's response: tokens under `response_mask` (B, R), special tokens dropped."""
    responses, mask = output.batch[keys.RESPONSES], output.batch[keys.RESPONSE_MASK].bool()
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(responses, mask)]


def generate(config: DictConfig | GenerationConfig) -> pd.DataFrame:
    """Run generation as configured; write and return the output frame (input rows + `responses`)."""
    from transformers import AutoTokenizer

    config = generation_config(config)
    check_generation_config(config)
    frame = pd.read_parquet(Path(config.data.path).expanduser())
    prompt_key = config.data.prompt_key
    if prompt_key not in frame.columns:
        raise KeyError(f"data.prompt_key={prompt_key!r}: no such column in {config.data.path}; "
                       f"has {list(frame.columns)}")
    worker = worker_config(config)
    tokenizer = AutoTokenizer.from_pretrained(worker.model.path, trust_remote_code=worker.model.trust_remote_code)
    device = config.trainer.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") or (device == "cuda" and num_devices(config) == 1
                                         and not torch.cuda.is_available()):
        raise ValueError(f"trainer.device={device!r}: use 'cuda' with a visible GPU, else 'cpu'")
    rollout = build_engine(config, tokenizer, device)
    n, batch_size = config.data.n_samples, config.data.batch_size
    prompt_length = worker.rollout.prompt_length
    texts: list[str] = []
    for start in tqdm(range(0, len(frame), batch_size), desc="generation"):
        chats = frame[prompt_key].iloc[start : start + batch_size].tolist()
        batch = build_prompt_batch(chats, tokenizer, prompt_length).repeat(n, interleave=True)
        texts.extend(decode_responses(rollout.generate_sequences(batch), tokenizer))
    out = frame.copy()
    grouped = np.empty(len(frame), dtype=object)
    grouped[:] = [texts[i * n : (i + 1) * n] for i in range(len(frame))]  # interleaved: row i's n are adjacent
    out[OUTPUT_COLUMN] = grouped
    path = Path(config.data.output_path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_parquet(path)
    return out


@hydra.main(config_path="config", config_name="generation", version_base=None)
def main(config: DictConfig) -> None:
    """Hydra entry point: `python -m rlpost.trainer.main_generation key=value ...`."""
    generate(config)


if __name__ == "__main__":
    main()
