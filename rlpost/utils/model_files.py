"""Is a local model folder whole? Checked before any worker starts, so a damaged file is named in seconds.

A truncated `*.safetensors` file, a `config.json` that is not JSON, a folder without tokenizer files or
without weights, and weights holding NaN/inf values (a file overwritten in place keeps its size) each fail
later, inside every worker, with a library's error that names no file. Here each is one `ValueError` naming
the key, the file and what to do.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterable

# Files any transformers tokenizer folder holds at least one of (fast tokenizers, BPE, WordPiece, SentencePiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# The NaN/inf scan reads every value; above this much it would add seconds per GiB to each start-up, and the
# workers' own load reads the files anyway: larger folders get the header checks alone.
SCAN_LIMIT_BYTES = 4 * 2**30
_FIX = "re-download or re-save the model (save_pretrained), or point the key at an intact folder"


def read_json_file(key: str, path: str) -> dict:
    """The JSON object in `path`; a syntax error names the file, line and column."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{key}: {path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                         f"{_FIX}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{key}: {path} is not a text file; {_FIX}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{key}: {path} holds a JSON {type(value).__name__}, not an object; {_FIX}")
    return value


def check_config_file(key: str, folder: str) -> dict:
    """`folder/config.json` exists and is a JSON object; returns it."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{key}={folder!r} has no config.json (files there: {_listing(folder)}); point it at a HF "
                         "model folder (config.json + weights + tokenizer), e.g. one made by "
                         "scripts/make_tiny_model.py")
    return read_json_file(key, path)


def safetensors_header(path: str) -> dict:
    """The JSON header of a `.safetensors` file, after checking the file holds every byte the header promises.

    Raises:
        ValueError: the file is shorter than its header or its tensors need (truncated), or the header is garbled.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path} is {size} bytes, too short for a safetensors file (truncated)")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise ValueError(f"{path} is {size} bytes but its header says {length + 8} bytes of header alone "
                             "(truncated or not a safetensors file)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"{path}: its safetensors header is not JSON (the file is damaged)") from None
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"
            and isinstance(v, dict) and "data_offsets" in v]
    need = 8 + length + max(ends, default=0)
    if size < need:
        raise ValueError(f"{path} is {size} bytes but its tensors need {need} (truncated: "
                         f"{need - size} bytes missing)")
    return header


def weight_files(folder: str) -> list[str]:
    """Weight files of a model folder: those an index file lists, else every file with a weight suffix."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        path = os.path.join(folder, index)
        if os.path.isfile(path):
            shards = sorted(set(read_json_file("weight index", path).get("weight_map", {}).values()))
            missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
            if missing:
                raise ValueError(f"{path} lists {len(missing)} shard(s) not in the folder, e.g. {missing[0]}; {_FIX}")
            return [os.path.join(folder, s) for s in shards]
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(WEIGHT_SUFFIXES))


def nonfinite_tensor(path: str) -> tuple[str, int] | None:
    """(name, count) of the first tensor in a `.safetensors` file holding NaN or inf values, or None."""
    import torch
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        for name in f.keys():
            tensor = f.get_tensor(name)
            if tensor.is_floating_point():
                bad = int((~torch.isfinite(tensor)).sum())
                if bad:
                    return name, bad
    return None


def check_weights(key: str, folder: str, files: Iterable[str] | None = None) -> None:
    """The folder has weights, each safetensors file whole; under `SCAN_LIMIT_BYTES` none holds NaN/inf."""
    files = list(weight_files(folder) if files is None else files)
    if not files:
        raise ValueError(f"{key}={folder!r} holds no weights (no *.safetensors or *.bin; files there: "
                         f"{_listing(folder)}); {_FIX}")
    tensors = [p for p in files if p.endswith(".safetensors")]
    for path in tensors:
        try:
            safetensors_header(path)
        except ValueError as err:
            raise ValueError(f"{key}: {err}; {_FIX}") from None
    if sum(os.path.getsize(p) for p in tensors) > SCAN_LIMIT_BYTES:
        return
    for path in tensors:
        found = nonfinite_tensor(path)
        if found:
            raise ValueError(f"{key}: {path} holds {found[1]} NaN/inf value(s) in {found[0]} (the file is damaged, "
                             f"or the model diverged before it was saved); training it would be NaN from step 1; "
                             f"{_FIX}")


def check_tokenizer_folder(key: str, folder: str) -> None:
    """The tokenizer folder holds tokenizer files (else transformers' error speaks of a chat template)."""
    if not any(os.path.isfile(os.path.join(folder, n)) for n in TOKENIZER_FILES):
        raise ValueError(f"{key}={folder!r} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES[:5])}, ...; "
                         f"files there: {_listing(folder)}); save the tokenizer into it "
                         "(tokenizer.save_pretrained) or set actor_rollout_ref.model.tokenizer_path to a folder "
                         "that has one")
    config = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config):
        read_json_file(key, config)


def check_model_folder(key: str, folder: str, weights: bool = True) -> None:
    """config.json readable; with `weights`, the weight files whole and finite (see `check_weights`)."""
    folder = os.path.expanduser(folder)
    check_config_file(key, folder)
    if weights:
        check_weights(key, folder)


def _listing(folder: str, limit: int = 8) -> str:
    names = sorted(os.listdir(folder))
    return (", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")) or "none"
