"""What a failed write to disk means, said plainly: a full disk, a missing permission, a read-only disk, or
a file where a folder should be; each with the path and the fix. Imports neither torch nor omegaconf."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

# What a failed write says, by errno; PyTorch's zip writer hides the errno ("file write failed", "unexpected
# pos"), so for those the free space of the disk decides.
_WRITE_ERRORS = {
    errno.ENOSPC: ("No space left on device", "free space on that disk or point trainer.default_local_dir at "
                   "a larger one (trainer.max_actor_ckpt_to_keep limits how many checkpoints are kept)"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota or point trainer.default_local_dir "
                   "elsewhere"),
    errno.EACCES: ("permission denied", "make the folder writable for this user or point "
                   "trainer.default_local_dir at a folder you can write"),
    errno.EROFS: ("read-only file system", "point trainer.default_local_dir at a writable disk"),
}
_TORCH_WRITE_FAILED = ("file write failed", "unexpected pos", "PytorchStreamWriter failed")
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\] [^:\n]*(?:: '([^'\n]+)')?")
_LOW_SPACE = 64 << 20  # bytes: below this a torch write failure is taken for a full disk


def describe_write_error(err: BaseException, path: str | Path) -> str | None:
    """"<what> writing <file>" plus the fix when `err` (or the worker traceback in its text) is a full disk,
    a missing permission or a read-only disk; None for any other error.

    Args:
        err: the exception of the save (an OSError, a torch RuntimeError, or a worker group's error whose
            text holds the worker's traceback).
        path: the folder being written, used when the error names no file.
    """
    code = getattr(err, "errno", None) if isinstance(err, OSError) else None
    where = getattr(err, "filename", None) if code else None
    if code is None:
        match = _ERRNO_IN_TEXT.search(str(err))
        if match:
            code, where = int(match.group(1)), match.group(2)
        elif any(marker in str(err) for marker in _TORCH_WRITE_FAILED) and _free_bytes(path) < _LOW_SPACE:
            code = errno.ENOSPC
    if code == errno.EPERM:
        code = errno.EACCES
    if code not in _WRITE_ERRORS:
        return None
    what, fix = _WRITE_ERRORS[code]
    free = _free_bytes(path)
    room = f" ({free / 2**20:.0f} MiB free there)" if code in (errno.ENOSPC, errno.EDQUOT) and free >= 0 else ""
    return f"{what} writing {where or path}{room}; {fix}"


def _free_bytes(path: str | Path) -> int:
    """Free bytes on the disk of `path` (or of its nearest existing parent); -1 when unknown."""
    for candidate in (Path(path), *Path(path).parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return -1


def unwritable_folder(root: str | Path) -> str | None:
    """Why `root` cannot be a checkpoint folder (a file in its place or on its path, no write permission on its
    nearest existing folder, or a disk with almost no free space); None when it can."""
    root = Path(root)
    for candidate in (root, *root.parents):
        if candidate.exists():
            if not candidate.is_dir():
                return f"{candidate} is a file, not a folder; remove or rename it, or choose another folder"
            if not os.access(candidate, os.W_OK | os.X_OK):
                return f"permission denied: {candidate} is not writable for this user; choose a folder you can write"
            free = _free_bytes(candidate)
            if 0 <= free < _LOW_SPACE:  # the first save would fail after the whole start-up and a step
                return (f"the disk of {candidate} is full ({free / 2**20:.1f} MiB free, under "
                        f"{_LOW_SPACE >> 20} MiB); free space there or point trainer.default_local_dir at a larger "
                        "disk")
            return None
    return None
