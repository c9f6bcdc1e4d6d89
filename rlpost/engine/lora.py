"""LoRA through PEFT: wrap a loaded HF model, check a config against a model, and turn the live (FSDP2-sharded)
adapter into what the rollout engine and the checkpoint need.

Config keys read (verl's names, `actor_rollout_ref.model` or `critic.model`): lora_rank (0 = off unless
lora_adapter_path is set), lora_alpha, target_modules ("all-linear" or a list of module names), exclude_modules,
lora_adapter_path (a saved adapter to train further: its own rank, alpha and target modules, as in verl).

Names: PEFT injects its layers into the HF model, so inside the model a targeted linear `X` holds
`X.base_layer.weight` (frozen) and `X.lora_A.default.weight` (r, in), `X.lora_B.default.weight` (out, r).
The merged weight of `X` is `W + scaling * B @ A`, `scaling = lora_alpha / r`. A PEFT adapter folder stores
`base_model.model.X.lora_A.weight` (no adapter name) next to `adapter_config.json`.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

import torch

from rlpost.checkpoint.format import LORA_SUBDIR
from rlpost.utils.lora_config import saved_adapter_config

ADAPTER_NAME = "default"
ADAPTER_DIR = LORA_SUBDIR  # sub-folder of a checkpoint holding the PEFT adapter
_PEFT_PREFIX = "base_model.model."
_SAVED_COPY = f".modules_to_save.{ADAPTER_NAME}."  # a fully trained module (a value model's head)


def _targets(value: Any) -> str | list[str]:
    return str(value) if isinstance(value, str) else [str(v) for v in value]


def peft_config(model_cfg: Any, value_model: bool = False, base_path: str | None = None):
    """The `peft.LoraConfig` of a model group. A value model keeps its fresh `score` head trainable."""
    from peft import LoraConfig, TaskType

    exclude = model_cfg.exclude_modules
    return LoraConfig(
        r=int(model_cfg.lora_rank), lora_alpha=int(model_cfg.lora_alpha),
        target_modules=_targets(model_cfg.target_modules),
        exclude_modules=None if exclude is None else _targets(exclude), lora_dropout=0.0, bias="none",
        task_type=TaskType.TOKEN_CLS if value_model else TaskType.CAUSAL_LM,
        modules_to_save=["score"] if value_model else None,
        base_model_name_or_path=base_path,
    )


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers (what `target_modules` lists), e.g. q_proj."""
    return sorted({name.rsplit(".", 1)[-1] for name, mod in model.named_modules()
                   if isinstance(mod, torch.nn.Linear) and name})


def apply_lora(model: torch.nn.Module, model_cfg: Any, group: str, value_model: bool = False):
    """Wrap `model` (loaded, on CPU) in a PEFT model: adapters trainable in float32, the rest frozen.

    Starts from `lora_adapter_path` when set (checked by `check_adapter_folder`), else fresh adapters
    (lora_B = 0: the wrapped model computes exactly what the base does).

    Args:
        group: the config group's key, for messages (e.g. "actor_rollout_ref.model").

    Returns:
        the `peft.PeftModel`; its `.base_model.model` is `model` with the LoRA layers injected.

    Raises:
        ValueError: target_modules match no module of the model (lists the model's linear layers).
    """
    from peft import PeftModel, get_peft_model

    path = model_cfg.lora_adapter_path
    if path:
        check_adapter_folder(str(path), model_cfg, model, group)
        wrapped = PeftModel.from_pretrained(model, str(path), is_trainable=True)
    else:
        try:
            wrapped = get_peft_model(model, peft_config(model_cfg, value_model, str(model_cfg.path)))
        except ValueError as err:
            raise ValueError(_no_match_message(model_cfg, model, group, err)) from None
    for param in wrapped.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()  # trainable master weights in float32; the frozen base keeps its dtype
    return wrapped


def _no_match_message(model_cfg: Any, model: torch.nn.Module, group: str, err: Exception) -> str:
    names = linear_module_names(model)
    return (f"{group}.target_modules={model_cfg.target_modules!r} matches no module of {model_cfg.path} ({err}); "
            f"its linear layers are {names}: use all-linear or a list of them, e.g. "
            f"{[n for n in names if n.endswith('_proj')] or names[:2]}")


def check_target_modules(model_cfg: Any, group: str) -> None:
    """Start-up check (no weights loaded): `target_modules` / `exclude_modules` select at least one layer, and every
    name of a `target_modules` list matches a module (a typo would leave its layers untrained, silently).

    The model is built on the meta device from its config, then PEFT matches the names as it will at load.
    """
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    hf_config = AutoConfig.from_pretrained(str(model_cfg.path), trust_remote_code=bool(model_cfg.trust_remote_code))
    # a vision-language config (a vision tower beside the language model) builds the image-text model
    cls = AutoModelForImageTextToText if getattr(hf_config, "vision_config", None) is not None else AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(hf_config, trust_remote_code=bool(model_cfg.trust_remote_code))
    try:
        get_peft_model(model, peft_config(model_cfg))
    except ValueError as err:
        raise ValueError(_no_match_message(model_cfg, model, group, err)) from None
    targets = model_cfg.target_modules
    if not isinstance(targets, str):  # a list: PEFT takes a module whose name is, or ends with '.', an entry
        names = [n for n, _ in model.named_modules() if n]
        missing = [t for t in map(str, targets) if not any(n == t or n.endswith("." + t) for n in names)]
        if missing:
            linear = linear_module_names(model)
            raise ValueError(f"{group}.target_modules={list(map(str, targets))!r}: {missing} match no module of "
                             f"{model_cfg.path} (the others would train alone); its linear layers are {linear}: "
                             f"use {[t for t in map(str, targets) if t not in missing] or linear[:2]} or all-linear")


def check_adapter_folder(path: str, model_cfg: Any, model: torch.nn.Module | None, group: str) -> None:
    """`lora_adapter_path` is a PEFT adapter folder, of `lora_rank` when that is set, whose layers fit `model` (when
    given).

    Raises:
        ValueError: naming the file and what differs (missing file, rank, layer names or shapes).
    """
    config_file = os.path.join(os.path.expanduser(path), "adapter_config.json")
    saved = saved_adapter_config(path)
    if saved is None:
        raise ValueError(f"{group}.lora_adapter_path={path!r}: {config_file} not found or not JSON; give a folder "
                         f"written by PEFT's save_pretrained or a checkpoint's actor/{ADAPTER_DIR}, or set it to null")
    if int(model_cfg.lora_rank) > 0 and int(saved.get("r", -1)) != int(model_cfg.lora_rank):
        raise ValueError(f"{group}.lora_adapter_path={path!r}: {config_file} has r={saved.get('r')} but "
                         f"{group}.lora_rank={model_cfg.lora_rank}; set {group}.lora_rank={saved.get('r')}")
    weights = _adapter_weights_file(path, group)
    if model is None:  # before the model loads: the weights file must at least be whole
        from rlpost.utils.model_files import safetensors_header

        try:
            safetensors_header(weights)
        except ValueError as err:
            raise ValueError(f"{group}.lora_adapter_path={path!r}: {err}; save the adapter again") from None
        return
    from safetensors import safe_open

    modules = dict(model.named_modules())
    with safe_open(weights, "pt") as f:
        for key in f.keys():
            if ".lora_A." not in key:
                continue
            name = key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key
            owner = modules.get(name.split(".lora_A.")[0])
            in_features = f.get_slice(key).get_shape()[1]
            if owner is None or getattr(owner, "in_features", None) != in_features:
                have = None if owner is None else getattr(owner, "in_features", None)
                raise ValueError(f"{group}.lora_adapter_path={path!r}: {weights} holds {key} with {in_features} "
                                 f"inputs, but {model_cfg.path} has " + ("no such layer" if owner is None else
                                 f"{have} there") + f": the adapter was trained on another base model "
                                 f"(adapter_config.json says {saved.get('base_model_name_or_path')!r})")


def _adapter_weights_file(path: str, group: str) -> str:
    folder = os.path.expanduser(path)
    weights = os.path.join(folder, "adapter_model.safetensors")
    if not os.path.isfile(weights):
        raise ValueError(f"{group}.lora_adapter_path={path!r}: {weights} not found (PEFT saves the adapter weights "
                         f"there; files in the folder: {sorted(os.listdir(folder))}); give the folder a save wrote "
                         "whole, or set lora_adapter_path to null")
    return weights


def _scaling(model: torch.nn.Module, module_name: str) -> float:
    return float(model.get_submodule(module_name).scaling[ADAPTER_NAME])


def merged_params(model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors with each adapter folded into its base weight (`W + scaling * B @ A`).

    Args:
        model: the HF model holding the LoRA layers (for each layer's scaling).
        named: its state-dict entries as full tensors in state-dict order (`iter_full_params`), where a
            layer's base weight comes before its lora_A and lora_B.
        dtype: dtype of the yielded tensors (the merge itself runs in float32).
    """
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        if ".lora_A." in name or ".lora_B." in name or ".base_layer.weight" in name:
            pending[name] = tensor
            owner = name.split(".lora_B.")[0] if ".lora_B." in name else None
            if owner is None:
                continue
            base = pending.pop(f"{owner}.base_layer.weight").float()
            a = pending.pop(f"{owner}.lora_A.{ADAPTER_NAME}.weight").float()
            b = pending.pop(name).float()
            merged = torch.addmm(base, b, a, alpha=_scaling(model, owner))  # never in place: base may be the param
            yield f"{owner}.weight", merged if dtype is None else merged.to(dtype)
            continue
        if ".lora_" in name or ".original_module." in name:
            continue  # a trained copy (modules_to_save) replaces the original module
        name = name.replace(".base_layer.", ".").replace(_SAVED_COPY, ".")
        yield name, tensor if dtype is None else tensor.to(dtype)
    if pending:
        raise RuntimeError(f"LoRA layers without their pair: {sorted(pending)[:4]}")


def is_adapter_entry(name: str) -> bool:
    """True for the state-dict entries `adapter_tensors` keeps (lora_A/B, trained module copies)."""
    return ".lora_A." in name or ".lora_B." in name or _SAVED_COPY in name


def adapter_tensors(named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
                    ) -> dict[str, torch.Tensor]:
    """The adapter entries of `named` (and trained module copies, e.g. a value head) under PEFT's saved names
    (`base_model.model.X.lora_A.weight`, `base_model.model.score.weight`), on CPU, in `dtype` (None: their own;
    the cast runs on their device, before the copy). Every entry of `named` is consumed (each full tensor may be a
    collective)."""
    out = {}
    for name, tensor in named:
        if is_adapter_entry(name):
            saved = name.replace(_SAVED_COPY, ".").replace(f".{ADAPTER_NAME}.", ".")
            out[_PEFT_PREFIX + saved] = tensor.detach().to("cpu", dtype, copy=True)
    return out


def save_adapter(out_dir: str, tensors: dict[str, torch.Tensor], config: Any) -> str:
    """Write a PEFT adapter folder (adapter_model.safetensors + adapter_config.json) from `adapter_tensors`."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "adapter_model.safetensors"))
    config.save_pretrained(out_dir)
    return out_dir
