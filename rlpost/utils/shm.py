"""Shared-memory copies (`model.use_shm`, `data.use_shm`): a local file or folder copied into /dev/shm once.

verl's semantics: the copy lives at `/dev/shm/verl-cache/<md5 of the absolute source path>/<basename>` and is
reused while it holds the same files with the same sizes (several ranks, roles and runs on one host share it).
Loading from /dev/shm reads RAM instead of a (network) disk: worth it when every rank of a host loads the same
model. The copy stays until the host reboots or someone removes it; it counts against /dev/shm's size.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

SHM_ROOT = "/dev/shm/verl-cache"


def _listing(path: Path) -> dict[str, int]:
    """Relative path -> size of every file under `path` (or of `path` itself when it is a file)."""
    if path.is_file():
        return {"": path.stat().st_size}
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


def shm_path(src: str | os.PathLike, root: str | None = None) -> Path:
    """Where `copy_to_shm` puts `src` (under `root`, default `SHM_ROOT`)."""
    root = SHM_ROOT if root is None else root
    absolute = os.path.abspath(os.path.normpath(os.path.expanduser(str(src))))
    return Path(root) / hashlib.md5(absolute.encode()).hexdigest() / os.path.basename(absolute)


def copy_to_shm(src: str | os.PathLike, root: str | None = None) -> str:
    """Copy the file or folder `src` under `root` (default `SHM_ROOT`) unless an identical copy is there;
    return the copy's path.

    Concurrent callers (the ranks of one host) are safe: each copies into its own temporary folder and
    renames it into place; the first rename wins and the others drop their copy (a rank that finds the
    winner's copy in place never removes it).

    Raises:
        FileNotFoundError: `src` does not exist (remote paths are not copied).
    """
    source = Path(os.path.expanduser(str(src)))
    if not source.exists():
        raise FileNotFoundError(f"use_shm: {src} does not exist (only local files and folders are copied)")
    dest = shm_path(source, root)
    if dest.exists() and _listing(dest) == _listing(source):
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".staging-")) / dest.name
    if source.is_dir():
        shutil.copytree(source, staging, symlinks=False)
    else:
        shutil.copyfile(source, staging)
    if dest.exists():
        if _listing(dest) == _listing(source):  # another rank's identical copy landed meanwhile: keep it
            shutil.rmtree(staging.parent, ignore_errors=True)
            return str(dest)
        # a stale copy (the source changed since): replaced by this one
        shutil.rmtree(dest, ignore_errors=True) if dest.is_dir() else dest.unlink(missing_ok=True)
    try:
        os.rename(staging, dest)
    except OSError:  # another rank renamed its identical copy first
        pass
    shutil.rmtree(staging.parent, ignore_errors=True)
    return str(dest)


def local_model_path(model_cfg) -> str:
    """`model.path`, or its /dev/shm copy with `model.use_shm` (actor_rollout_ref.model / critic.model)."""
    return copy_to_shm(model_cfg.path) if model_cfg.use_shm else str(model_cfg.path)
