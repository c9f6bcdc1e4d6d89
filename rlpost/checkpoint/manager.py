"""Checkpoint directories: atomic saves, retention, the `latest` file, manifests and resume resolution.

Layout under `trainer.default_local_dir` (the `root`; every name is `rlpost.checkpoint.format`'s)::

    root/
      latest_checkpointed_iteration.txt   # "N": the newest committed step (written last, atomically)
      global_step_N/
        actor/        # written by ActorRolloutRefWorker.save_checkpoint (per-rank shards, huggingface/)
        critic/       # written by CriticWorker.save_checkpoint
        data.pt       # dataloader state, written by the trainer
        manifest.json # {"step", "epoch", "world_size", "config_hash", "config_fields", "contents",
                      #  "files": {relative path: {"size", "blake2b"}}, "complete": true, "time"}
      .tmp_global_step_M/   # a save in progress (or one that crashed); never resumed from

A save is `tmp = mgr.begin(step)`, then everyone writes into `tmp`, then `mgr.commit(step, manifest)`:
the manifest is written into `tmp`, `tmp` is renamed to `global_step_N` (one `os.replace`, atomic on a
POSIX file system), and only then the latest file is replaced. A crash at any moment therefore leaves
either the previous checkpoint set untouched plus a `.tmp_*` folder, or the new checkpoint complete.
Old checkpoints are pruned only after a commit, so there is always one complete checkpoint on disk.
`commit` records a checksum of every file; a resume verifies them (`verify_files`), so a shard damaged
in place (same size) is named instead of loaded, and `resume_mode=auto` falls back to the newest intact one.

This module imports neither torch nor omegaconf: it only moves folders and reads small JSON files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

from rlpost.checkpoint.format import (  # noqa: F401  (ACTOR_DIR, CRITIC_DIR: part of this module's API)
    ACTOR_DIR,
    CRITIC_DIR,
    DATA_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    STEP_PREFIX,
    TMP_PREFIX,
)
from rlpost.utils.disk_errors import describe_write_error, unwritable_folder

logger = logging.getLogger(__name__)

RESUME_MODES = ("auto", "disable", "resume_path")

# Config keys whose values must be equal between the run that saved and the run that resumes:
# the shards and the optimizer state only make sense for the same model, the same sharding (world size),
# and the dataloader state only for the same batch size. Missing keys hash as null.
CONFIG_HASH_KEYS = (
    "actor_rollout_ref.model.path",
    "critic.model.path",
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.rollout.n",
    "critic.ppo_mini_batch_size",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
)

class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (its files differ from what its manifest recorded), or one
    that cannot be written (full disk, no permission, a file where its folder should be)."""


_STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d+)$")


def _select(cfg: Any, dotted: str) -> Any:
    """Value at a dotted key of nested mappings/attribute objects (DictConfig works); None if absent."""
    node = cfg
    for part in dotted.split("."):
        if isinstance(node, Mapping) or hasattr(node, "get"):
            try:
                node = node.get(part)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - e.g. missing mandatory value in a DictConfig
                return None
        else:
            node = getattr(node, part, None)
        if node is None:
            return None
    return node


def config_fields(cfg: Any) -> dict[str, Any]:
    """The values of `CONFIG_HASH_KEYS` in `cfg` (plain JSON types; absent keys -> None)."""
    fields = {}
    for key in CONFIG_HASH_KEYS:
        value = _select(cfg, key)
        fields[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    return fields


def config_hash(cfg: Any) -> str:
    """Short sha256 (16 hex chars) over `config_fields(cfg)`: model paths, batch sizes, world size."""
    blob = json.dumps(config_fields(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_manifest(
    step: int,
    epoch: int,
    world_size: int,
    cfg: Any = None,
    contents: list[str] | None = None,
) -> dict[str, Any]:
    """The manifest dict the trainer passes to `CheckpointManager.commit`."""
    return {
        "step": int(step),
        "epoch": int(epoch),
        "world_size": int(world_size),
        "config_hash": config_hash(cfg) if cfg is not None else None,
        "config_fields": config_fields(cfg) if cfg is not None else None,
        "contents": list(contents or []),
    }


def file_checksums(ckpt_dir: str | Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "blake2b"}} of every file under `ckpt_dir` except the manifest."""
    root = Path(ckpt_dir)
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST_FILE:
            out[rel] = {"size": path.stat().st_size, "blake2b": _blake2b(path)}
    return out


def _blake2b(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)  # fast on CPU; integrity against damage, not an attacker
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def verify_files(ckpt_dir: str | Path, manifest: Mapping[str, Any]) -> list[str]:
    """Problems with the files the manifest lists: "<path>: missing / size A != B / checksum mismatch".

    Empty when all match, or when the manifest predates checksums (no "files" entry).
    """
    root = Path(ckpt_dir)
    problems = []
    for rel, want in (manifest.get("files") or {}).items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != want["size"]:
            problems.append(f"{path}: size {path.stat().st_size} bytes, saved as {want['size']}")
        elif _blake2b(path) != want["blake2b"]:
            problems.append(f"{path}: checksum mismatch (the file changed after it was saved)")
    return problems


_INTACT: set[tuple[str, Any]] = set()  # (folder, manifest time) of checkpoints this process verified intact


def _problems(path: Path) -> list[str]:
    """`verify_files` of a committed checkpoint, remembering intact ones: a run resolves its resume point
    before Ray starts and again when loading, and hashing a large checkpoint twice would cost minutes."""
    manifest = read_manifest(path) or {}
    key = (str(Path(path).resolve()), manifest.get("time"))
    if key in _INTACT:
        return []
    problems = verify_files(path, manifest)
    if not problems:
        _INTACT.add(key)
    return problems


def read_manifest(ckpt_dir: str | Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint folder if it exists, parses and says complete=true; else None."""
    path = Path(ckpt_dir) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("complete") is True else None


def check_compatible(
    manifest: Mapping[str, Any],
    world_size: int,
    config_hash: str | None,  # shadows the function on purpose (the brief's argument name)
    fields: Mapping[str, Any] | None = None,
) -> None:
    """Raise ValueError naming the field that differs between a checkpoint and the current run.

    Args:
        manifest: the checkpoint's manifest (see `read_manifest`).
        world_size: number of training ranks of the current run.
        config_hash: `config_hash(cfg)` of the current run (None skips the check).
        fields: `config_fields(cfg)` of the current run, to name the differing keys in the message.
    """
    saved_ws = manifest.get("world_size")
    if saved_ws is not None and int(saved_ws) != int(world_size):
        raise ValueError(
            f"checkpoint at step {manifest.get('step')} was saved with world_size={saved_ws}, "
            f"the current run has world_size={world_size}; resume with the same trainer.nnodes x "
            f"trainer.n_gpus_per_node or start a new run (trainer.resume_mode=disable)"
        )
    saved_hash = manifest.get("config_hash")
    if config_hash is None or saved_hash is None or saved_hash == config_hash:
        return
    saved_fields = manifest.get("config_fields") or {}
    diffs = [
        f"{k}: checkpoint={saved_fields.get(k)!r} now={v!r}"
        for k, v in (fields or {}).items()
        if saved_fields.get(k) != v
    ]
    detail = "; ".join(diffs) if diffs else f"hash {saved_hash} != {config_hash}"
    raise ValueError(
        f"checkpoint at step {manifest.get('step')} does not match the current config ({detail}); "
        f"these keys must be equal to resume: {', '.join(CONFIG_HASH_KEYS)}"
    )


def step_of(path: str | Path) -> int | None:
    """N for a folder named `global_step_N`, else None."""
    match = _STEP_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def _fsync_dir(path: Path) -> None:
    """Persist a rename/creation in `path` (best effort: not every file system supports it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # e.g. EINVAL where directories cannot be fsynced: the rename stands
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to a sibling temp file, fsync it, then `os.replace` it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def prune_oldest(paths: list[str | Path], keep: int | None) -> list[Path]:
    """Delete every folder of `paths` (oldest first) but the `keep` newest; None or <= 0 keeps all.

    The one retention rule of rlpost (trainer checkpoints, worker saves, SFT saves). Returns what it deleted.
    """
    if keep is None or keep <= 0:
        return []
    doomed = [Path(p) for p in paths[:-keep]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


class CheckpointManager:
    """Owns the `global_step_N` folders under `root` (single writer: the trainer's driver process)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def step_dir(self, step: int) -> Path:
        """Final folder of step `step` (exists only once committed)."""
        return self.root / f"{STEP_PREFIX}{int(step)}"

    def tmp_dir(self, step: int) -> Path:
        """Temporary folder a save of step `step` is written into."""
        return self.root / f"{TMP_PREFIX}{int(step)}"

    def begin(self, step: int) -> Path:
        """Start a save: return a fresh, empty temp folder (a stale one from a crash is removed)."""
        tmp = self.tmp_dir(step)
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        except OSError as err:
            raise CheckpointError(f"cannot save the checkpoint of step {step}: "
                                  f"{unwritable_folder(self.root) or describe_write_error(err, tmp) or err}") from err
        return tmp

    def abort(self, step: int, err: BaseException) -> None:
        """A save of `step` failed: remove its temp folder, then raise `CheckpointError` naming a full disk /
        missing permission as such (other errors are re-raised as they are). Committed checkpoints stay."""
        tmp = self.tmp_dir(step)
        reason = describe_write_error(err, tmp)  # before the removal: the disk is still as full as it was
        shutil.rmtree(tmp, ignore_errors=True)
        if reason is None:
            raise err
        latest = self.find_latest_complete()
        kept = f"the newest saved checkpoint, {latest[1]}, is intact" if latest else "no earlier checkpoint exists"
        raise CheckpointError(f"cannot save the checkpoint of step {step}: {reason}. The partial save {tmp} was "
                              f"removed; {kept}") from err

    def commit(self, step: int, manifest: Mapping[str, Any]) -> Path:
        """Finish a save: write the manifest, rename temp -> `global_step_N`, then update the latest file.

        Re-saving an already committed step replaces it (the old folder is moved aside first and deleted
        after the rename, so a crash in between still leaves one complete copy).
        """
        tmp, final = self.tmp_dir(step), self.step_dir(step)
        if not tmp.is_dir():
            raise FileNotFoundError(f"commit({step}) without begin({step}): {tmp} does not exist")
        body = {**dict(manifest), "step": int(step), "files": file_checksums(tmp), "complete": True,
                "time": time.time()}
        atomic_write_text(tmp / MANIFEST_FILE, json.dumps(body, indent=2, sort_keys=True))
        old = None
        if final.exists():
            old = self.root / f".old_{final.name}_{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        atomic_write_text(self.root / LATEST_FILE, str(int(step)))
        return final

    def list_complete(self) -> list[tuple[int, Path]]:
        """All committed checkpoints with a complete manifest, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            step = step_of(child)
            if step is not None and child.is_dir() and read_manifest(child) is not None:
                found.append((step, child))
        return sorted(found)

    def find_latest_complete(self) -> tuple[int, Path] | None:
        """(step, path) of the newest complete checkpoint; partial, temp and manifest-less folders are skipped."""
        complete = self.list_complete()
        return complete[-1] if complete else None

    def read_latest_file(self) -> int | None:
        """The step recorded in the latest file, or None if missing/garbled (informational only)."""
        try:
            return int((self.root / LATEST_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def clean_stale(self) -> list[Path]:
        """Delete leftover temp folders of crashed saves; return what was removed.

        A `.old_global_step_N_*` folder whose `global_step_N` is missing (a re-save of step N crashed between
        its two renames) is the only complete copy of step N: it is renamed back instead of deleted.
        """
        if not self.root.is_dir():
            return []
        removed = []
        for path in sorted(self.root.iterdir()):
            if not path.is_dir():
                continue
            if path.name.startswith(".old_"):
                final = self.root / path.name[len(".old_"):].rsplit("_", 1)[0]
                if not final.exists() and read_manifest(path) is not None:
                    os.replace(path, final)
                    continue
            elif not path.name.startswith(TMP_PREFIX):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        return removed

    def prune(self, keep: int | None) -> list[Path]:
        """Keep the `keep` newest complete checkpoints, delete older ones and stale temp folders.

        `keep` None or <= 0 keeps everything (verl semantics of `max_*_ckpt_to_keep: null`). Incomplete
        `global_step_*` folders are never counted and never deleted here (a person may be inspecting them).
        """
        removed = self.clean_stale()
        return removed + prune_oldest([path for _, path in self.list_complete()], keep)

    def resolve_resume(self, resume_mode: str, resume_path: str | Path | None = None) -> Path | None:
        """The checkpoint folder to resume from, or None to train from scratch.

        Args:
            resume_mode: `trainer.resume_mode`: `auto` (newest complete checkpoint under root, else None;
                stale temp folders are cleaned first),
                `resume_path` (`resume_path` must be a complete checkpoint folder), `disable` (None).
            resume_path: `trainer.resume_from_path`.
        """
        if resume_mode not in RESUME_MODES:
            raise ValueError(f"trainer.resume_mode={resume_mode!r} is not one of {RESUME_MODES}")
        if resume_mode == "disable":
            logger.info("resume_mode=disable: training from scratch")
            return None
        if resume_mode == "resume_path":
            path = self._explicit_resume(resume_path)
            problems = _problems(path)
            if problems:
                intact = CheckpointManager(path.parent).newest_intact()
                hint = (f"the newest intact checkpoint is {intact} (set trainer.resume_from_path to it)"
                        if intact is not None else "no intact checkpoint is left beside it")
                raise CheckpointError(f"trainer.resume_from_path={str(path)!r} is damaged: {'; '.join(problems)}; "
                                 f"{hint}")
            return path
        self.clean_stale()  # also restores a step whose re-save crashed mid-swap
        if resume_path is not None:
            logger.warning("trainer.resume_from_path=%s is not used with resume_mode=auto", resume_path)
        complete = self.list_complete()
        for step, path in reversed(complete):
            problems = _problems(path)
            if not problems:
                logger.info("resume_mode=auto: resuming from %s (step %d)", path, step)
                return path
            logger.warning("resume_mode=auto: checkpoint %s is damaged, not resuming from it: %s; "
                           "trying the previous one", path, "; ".join(problems))
        if complete:  # a fresh folder is the usual start, not worth a warning
            logger.warning("resume_mode=auto: no intact checkpoint under %s, training from scratch", self.root)
        return None

    def newest_intact(self) -> Path | None:
        """The newest complete checkpoint whose files all verify."""
        for _, path in reversed(self.list_complete()):
            if not verify_files(path, read_manifest(path) or {}):
                return path
        return None

    @staticmethod
    def _explicit_resume(resume_path: str | Path | None) -> Path:
        """Validate `trainer.resume_from_path` for resume_mode=resume_path."""
        if resume_path is None:
            raise CheckpointError("trainer.resume_mode=resume_path needs trainer.resume_from_path (got null)")
        path = Path(resume_path)
        if step_of(path) is None:
            raise CheckpointError(
                f"trainer.resume_from_path={str(path)!r} must be a folder named {STEP_PREFIX}<N>"
            )
        if read_manifest(path) is None:
            found = [p.name for _, p in CheckpointManager(path.parent).list_complete()] if path.parent.is_dir() else []
            raise CheckpointError(
                f"trainer.resume_from_path={str(path)!r} is not a complete checkpoint "
                f"(missing folder or {MANIFEST_FILE} without complete=true); complete checkpoints in "
                f"{str(path.parent)!r}: {found or 'none'} (or trainer.resume_mode=auto / disable)"
            )
        logger.info("resume_mode=resume_path: resuming from %s", path)
        return path


def effective_keep(
    max_actor_ckpt_to_keep: int | None,
    max_critic_ckpt_to_keep: int | None,
    remove_previous_ckpt_in_save: bool = False,
) -> int | None:
    """How many whole `global_step_N` folders to keep.

    Actor and critic live in the same step folder and a resume needs both, so the stricter of the two
    limits applies to the folder. `remove_previous_ckpt_in_save=True` means keep 1 (verl's older knob).
    """
    limits = [k for k in (max_actor_ckpt_to_keep, max_critic_ckpt_to_keep) if k is not None and k > 0]
    if remove_previous_ckpt_in_save:
        limits.append(1)
    return min(limits) if limits else None
