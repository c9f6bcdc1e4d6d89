"""verl's `copy_to_local`: the local path of a model or data location (no remote file systems at run time)."""

from __future__ import annotations

import os


def copy_to_local(src: str, cache_dir: str | None = None, filelock: str = ".file.lock", verbose: bool = False,
                  always_recopy: bool = False, use_shm: bool = False) -> str:
    """`src` as an absolute local path.

    rlpost reads models and data from local folders only; a remote location (`hdfs://`, `s3://`, ...)
    raises a ValueError that says so. The other arguments exist for verl's signature and change nothing.
    """
    if "://" in src:
        raise ValueError(f"{src!r}: remote locations are not read at run time; copy it to a local folder first")
    if use_shm:
        raise ValueError("use_shm=True: loading through shared memory is not supported yet")
    return os.path.abspath(os.path.expanduser(src))


copy_local_path_from_hdfs = copy_to_local  # verl's older name


def is_non_local(path: str) -> bool:
    """True for an HDFS location (`hdfs://...`), which `copy_to_local` refuses; verl's test, so a recipe that
    branches on it takes its local branch for every path rlpost reads."""
    return str(path).startswith("hdfs://")
