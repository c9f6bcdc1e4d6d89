"""Turn a sharded FSDP checkpoint (`global_step_N/actor` or `/critic`) into a transformers folder.

    python -m rlpost.model_merger merge --backend fsdp --local_dir ckpts/global_step_10/actor --target_dir out/
    python -m rlpost.model_merger test  --backend fsdp --local_dir ckpts/global_step_10/actor --test_hf_dir out/

A LoRA checkpoint (it has `lora_adapter/`) exports its PEFT adapter folder as it is, or with `--merge_lora` the
base model (`adapter_config.json`'s base_model_name_or_path, or `--base_model`) with the adapter folded in.

The shard format (files, `fsdp_meta.json`, `Shard(0)` / `Replicate()`) is `rlpost.checkpoint.format`'s.
Without `fsdp_meta.json` (a checkpoint written before workers wrote it), W is read from the file names and every
tensor with a dim is taken as `Shard(0)`.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from rlpost.checkpoint.format import HF_SUBDIR, LORA_SUBDIR, REPLICATE, SHARD, read_fsdp_meta, shard_file

def gather_shard0(pieces: Sequence[torch.Tensor], shape: Sequence[int], name: str = "") -> torch.Tensor:
    """Concatenate dim-0 shards (torch.chunk layout, trailing ranks possibly empty) and check the shape."""
    rows = int(shape[0])
    chunk = math.ceil(rows / len(pieces)) if rows else 0
    for rank, piece in enumerate(pieces):
        expected = max(0, min(chunk, rows - rank * chunk))
        if piece.shape[0] != expected or list(piece.shape[1:]) != list(shape[1:]):
            raise ValueError(
                f"{name}: rank {rank} holds shape {list(piece.shape)}, expected [{expected}, *{list(shape[1:])}] "
                f"for full shape {list(shape)} over {len(pieces)} ranks"
            )
    return torch.cat([p for p in pieces if p.shape[0] > 0] or [pieces[0]], dim=0)


def load_full_state(local_dir: str | Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Read every rank's shard file of `local_dir` and return the full state dict (HF names)."""
    meta = read_fsdp_meta(local_dir)
    world = int(meta["world_size"])
    files = [shard_file(local_dir, world, r) for r in range(world)]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"missing shard files: {missing}")
    shards = [torch.load(f, map_location="cpu", weights_only=True, mmap=True) for f in files]
    params = meta.get("params") or {
        n: {"shape": None, "placement": SHARD if t.dim() > 0 else REPLICATE} for n, t in shards[0].items()
    }
    full = {}
    for name, info in params.items():
        pieces = [s[name] for s in shards]
        if info["placement"] == REPLICATE:
            tensor = pieces[0]
        elif info["placement"] == SHARD:
            shape = info["shape"] or [sum(p.shape[0] for p in pieces), *pieces[0].shape[1:]]
            tensor = gather_shard0(pieces, shape, name)
        else:
            raise ValueError(f"not supported yet: placement {info['placement']} of {name}")
        full[name] = tensor.to(dtype) if dtype is not None else tensor.clone()
    return full


def _model_class(config: Any, names: Sequence[str], meta_class: str | None) -> type:
    """The transformers class to rebuild: meta's model_class, else config.architectures[0].

    A critic saved from a causal-LM config has a `score` head: its class becomes ...ForTokenClassification.
    """
    import transformers

    name = meta_class or (config.architectures or [None])[0]
    if name is None:
        raise ValueError("cannot tell the model class: no model_class in fsdp_meta.json and no config.architectures")
    if "score.weight" in names and "lm_head.weight" not in names and name.endswith("ForCausalLM"):
        name = name[: -len("ForCausalLM")] + "ForTokenClassification"
    if not hasattr(transformers, name):
        raise ValueError(f"transformers has no class {name!r} (trust_remote_code models: not supported yet)")
    return getattr(transformers, name)


def merge(local_dir: str | Path, target_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write a `from_pretrained`-loadable folder (config, tokenizer, safetensors) for `local_dir` into `target_dir`."""
    from transformers import AutoConfig

    local_dir, target = Path(local_dir), Path(target_dir)
    hf_dir = local_dir / HF_SUBDIR
    if not (hf_dir / "config.json").exists():
        raise FileNotFoundError(f"{hf_dir / 'config.json'} is missing (the worker saves config + tokenizer there)")
    state = load_full_state(local_dir, dtype)
    config = AutoConfig.from_pretrained(hf_dir)
    cls = _model_class(config, list(state), read_fsdp_meta(local_dir).get("model_class"))
    if "score.weight" in state:
        config.num_labels = state["score.weight"].shape[0]
    with torch.device("meta"):
        model = cls(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise ValueError(f"state/model mismatch: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    model.tie_weights()
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    for src in hf_dir.iterdir():  # tokenizer + generation config; weights come from the shards
        if src.is_file() and not (target / src.name).exists() and not src.name.endswith((".safetensors", ".bin")):
            shutil.copy2(src, target / src.name)
    return target


def merge_lora(local_dir: str | Path, target_dir: str | Path, merge_into_base: bool, base_model: str | None = None,
               dtype: torch.dtype | None = None) -> Path:
    """Export the LoRA adapter of `local_dir`: the PEFT folder itself, or the merged HF model.

    Raises:
        FileNotFoundError: the checkpoint has no adapter, or the base model folder is missing (named).
    """
    adapter, target = Path(local_dir) / LORA_SUBDIR, Path(target_dir)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter / 'adapter_config.json'} is missing: {local_dir} is not a LoRA checkpoint")
    hf_dir = Path(local_dir) / HF_SUBDIR
    tokenizer_files = [f for f in hf_dir.iterdir() if f.is_file() and "token" in f.name] if hf_dir.is_dir() else []
    target.mkdir(parents=True, exist_ok=True)
    if not merge_into_base:
        for src in [*adapter.iterdir(), *tokenizer_files]:
            shutil.copy2(src, target / src.name)
        return target
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    base = base_model or json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(f"base model {base!r} (from {adapter / 'adapter_config.json'}) is not a local folder; "
                                "pass --base_model <the HF folder the run trained on>")
    value_model = json.loads((adapter / "adapter_config.json").read_text()).get("task_type") == "TOKEN_CLS"
    cls = AutoModelForTokenClassification if value_model else AutoModelForCausalLM
    extra = {"num_labels": 1} if value_model else {}
    model = cls.from_pretrained(base, dtype=dtype or torch.float32, **extra)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(target, safe_serialization=True)
    for src in tokenizer_files:
        shutil.copy2(src, target / src.name)
    return target


def _load_safetensors_dir(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the `*.safetensors` files of a HF folder."""
    from safetensors.torch import load_file

    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def compare(local_dir: str | Path, test_hf_dir: str | Path, atol: float = 1e-6) -> list[str]:
    """Compare the merged shards with a HF folder; print max |diff| per tensor; return the problems found."""
    merged = load_full_state(local_dir)
    reference = _load_safetensors_dir(test_hf_dir)
    config = json.loads((Path(test_hf_dir) / "config.json").read_text())
    problems = []
    for name, tensor in merged.items():
        if name not in reference:
            if not (name == "lm_head.weight" and config.get("tie_word_embeddings")):
                problems.append(f"{name}: missing in {test_hf_dir}")
            continue
        ref = reference[name]
        if list(ref.shape) != list(tensor.shape):
            problems.append(f"{name}: shape {list(tensor.shape)} != {list(ref.shape)}")
            continue
        diff = (tensor.float() - ref.float()).abs().max().item() if tensor.numel() else 0.0
        print(f"{name}\tmax_abs_diff={diff:.3e}")
        if not diff <= atol:
            problems.append(f"{name}: max abs diff {diff:.3e} > atol {atol:g}")
    problems += [f"{n}: only in {test_hf_dir}" for n in reference if n not in merged]
    return problems


_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlpost.model_merger", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="operation", required=True)
    for op in ("merge", "test"):
        p = sub.add_parser(op, help="write a HF folder" if op == "merge" else "compare shards with a HF folder")
        p.add_argument("--backend", default="fsdp", help="checkpoint backend (only fsdp is built)")
        p.add_argument("--local_dir", required=True, help="global_step_N/actor (or /critic) folder")
        if op == "merge":
            p.add_argument("--target_dir", required=True, help="output folder for from_pretrained")
            p.add_argument("--dtype", default="auto", choices=sorted(_DTYPES), help="weights dtype (auto: as saved)")
            p.add_argument("--merge_lora", action="store_true",
                           help="LoRA checkpoint: write the base model with the adapter merged (default: adapter)")
            p.add_argument("--base_model", default=None, help="LoRA: base HF folder (default: adapter_config.json)")
        else:
            p.add_argument("--test_hf_dir", required=True, help="HF folder to compare against")
            p.add_argument("--atol", type=float, default=1e-6, help="max allowed abs diff per tensor")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; returns the exit code (0 ok, 1 mismatch in `test`)."""
    args = _parser().parse_args(argv)
    if args.backend != "fsdp":
        raise SystemExit(f"not supported yet: --backend {args.backend} (only fsdp)")
    if args.operation == "merge" and (Path(args.local_dir) / LORA_SUBDIR).is_dir():
        out = merge_lora(args.local_dir, args.target_dir, args.merge_lora, args.base_model, _DTYPES[args.dtype])
        print(f"saved {'merged HF model' if args.merge_lora else 'LoRA adapter (PEFT folder)'} to {out}")
        return 0
    if args.operation == "merge":
        out = merge(args.local_dir, args.target_dir, _DTYPES[args.dtype])
        print(f"saved HF model to {out}")
        return 0
    problems = compare(args.local_dir, args.test_hf_dir, args.atol)
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stderr)
    print("OK: merged shards match" if not problems else f"FAILED: {len(problems)} mismatching tensors")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
