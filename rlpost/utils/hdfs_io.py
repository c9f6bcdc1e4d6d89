"""verl's `hdfs_io` helpers (`exists`, `makedirs`, `copy`) for the local file system.

verl's data-preparation scripts import `copy` and `makedirs` from here to publish their parquet files.
rlpost reads local paths only: these work on local paths (`file://` accepted) and raise
"not supported yet" for `hdfs://` and other remote locations, naming the path.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

__all__ = ["copy", "exists", "makedirs", "mkdir"]


def _local(path: str) -> str:
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" in path:
        raise ValueError(f"not supported yet: remote path {path!r} (rlpost.utils.hdfs_io handles local paths; "
                         "copy the files with your storage's own tool)")
    return os.path.expanduser(path)


def exists(path: str, **kwargs: Any) -> bool:
    """Whether `path` exists."""
    return os.path.exists(_local(path))


def makedirs(name: str, mode: int = 0o777, exist_ok: bool = False, **kwargs: Any) -> None:
    """`os.makedirs` of a local folder."""
    os.makedirs(_local(name), mode=mode, exist_ok=exist_ok)


def mkdir(path: str, **kwargs: Any) -> None:
    """Create `path` and its parents; an existing folder is fine."""
    os.makedirs(_local(path), exist_ok=True)


def copy(src: str, dst: str, **kwargs: Any) -> bool:
    """Copy a file, or a folder with everything in it, from `src` to `dst` (a folder merges into an
    existing one). Returns True."""
    src, dst = _local(src), _local(dst)
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)
    return True
