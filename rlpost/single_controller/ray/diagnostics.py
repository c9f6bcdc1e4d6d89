"""What a worker process writes, and how the driver looks inside a worker that stopped answering.

Worker side (`setup_worker_process`, called by `WorkerHost.setup` before any role is built):
- its Python stacks can be dumped on demand: `faulthandler` is registered on SIGUSR1 and writes every
  thread's stack to `<log dir>/stack_<roles>_rank<r>_pid<p>.txt`. The handler runs in C, so it answers even while
  the worker is stuck in a sleep, a collective or a C extension, and needs no py-spy;
- with quiet logs (`trainer.verbose_engine_logs=false`), the process's stdout and stderr (vLLM's and Ray's
  INFO lines, progress bars, C-level warnings) go to `<log dir>/worker_<roles>_rank<r>_pid<p>.log` (roles:
  the worker group's roles in that process, e.g. `actor_rollout-ref`); only rlpost's
  own warnings still reach the driver's console;
- a harmless vLLM warning repeated on every weight sync is dropped (see `_HarmlessEngineWarnings`);
- it ends itself when the driver process dies, even by SIGKILL (`_exit_with_driver`).

Driver side (`collect_stacks`): signal the ranks that have not answered and read back what they wrote; ranks
on other hosts through a task placed on their node, so a multi-node run's report holds every rank.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

LOG_DIR_ENV = "RLPOST_WORKER_LOG_DIR"  # folder for worker logs and stack dumps (default: a temp folder)
QUIET_ENV = "RLPOST_QUIET_WORKERS"  # "1": worker stdout/stderr go to the log file, not the console
DRIVER_PID_ENV, DRIVER_HOST_ENV = "RLPOST_DRIVER_PID", "RLPOST_DRIVER_HOST"  # workers end when it dies
STACK_SIGNAL = signal.SIGUSR1

_stack_file = None  # kept open for the life of the process: faulthandler writes to its descriptor


@dataclass(frozen=True)
class WorkerInfo:
    """Where a worker process runs and where its stack dumps go (returned by `WorkerHost.setup`)."""

    rank: int
    pid: int
    host: str
    stack_file: str
    log_file: str | None
    node_id: str = ""  # Ray's id of its node: a rank on another host is dumped by a task placed there


def log_dir() -> Path:
    """The folder for worker logs and stack dumps of this process (created if missing)."""
    path = Path(os.environ.get(LOG_DIR_ENV) or Path(tempfile.gettempdir()) / "rlpost_worker_logs")
    path.mkdir(parents=True, exist_ok=True)
    return path


def setup_worker_process(rank: int, roles: str = "") -> WorkerInfo:
    """Register the stack dump, quiet the output if asked, filter known-harmless warnings.

    Args:
        rank: the process's rank in its worker group.
        roles: the roles it hosts joined by "-" (e.g. "actor_rollout-ref"), the start of its file names: with
            split placement a trainer and a rollout process both have rank 0.
    """
    global _stack_file
    folder, pid = log_dir(), os.getpid()
    name = f"{roles}_rank{rank}_pid{pid}" if roles else f"rank{rank}_pid{pid}"
    stack_path = folder / f"stack_{name}.txt"
    if _stack_file is None:
        _stack_file = open(stack_path, "a")
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    stack_path = Path(_stack_file.name)  # the one registered, should a process set up twice
    log_file = None
    if os.environ.get(QUIET_ENV) == "1":
        log_file = folder / f"worker_{name}.log"
        _redirect_output(log_file)
    for name in _HarmlessEngineWarnings.LOGGERS:
        logging.getLogger(name).addFilter(_HarmlessEngineWarnings())
    _exit_with_driver(os.environ.get(DRIVER_PID_ENV), os.environ.get(DRIVER_HOST_ENV))
    return WorkerInfo(rank, pid, socket.gethostname(), str(stack_path), str(log_file) if log_file else None,
                      _node_id())


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - outside a Ray worker there is no node to name
        return ""


def driver_env() -> dict[str, str]:
    """The variables by which a worker finds the process that drives it (set by the worker group)."""
    return {DRIVER_PID_ENV: str(os.getpid()), DRIVER_HOST_ENV: socket.gethostname()}


def _exit_with_driver(pid: str | None, host: str | None, period_s: float = 1.0) -> None:
    """End this process within `period_s` of the driver's death, whatever it is doing.

    Ray ends its workers when the driver exits normally; after a SIGKILL of the driver a worker busy in a
    long call (generation, a collective) would keep its memory and devices until Ray noticed. Only a driver
    on this host can be watched (a pid means nothing elsewhere).
    """
    if not pid or host != socket.gethostname() or getattr(_exit_with_driver, "started", False):
        return
    _exit_with_driver.started = True

    def watch() -> None:
        while True:
            time.sleep(period_s)
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                print(f"[rlpost] the driver (pid {pid}) has exited: ending worker pid {os.getpid()}", flush=True)
                os._exit(1)
            except PermissionError:  # alive, owned by another user
                continue

    threading.Thread(target=watch, name="rlpost-driver-watch", daemon=True).start()


def _redirect_output(path: Path) -> None:
    """Point descriptors 1 and 2 at `path`; rlpost's warnings keep going to the console through a copy of
    the old stderr (Ray forwards that to the driver)."""
    console = os.fdopen(os.dup(2), "w", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    handler = logging.StreamHandler(console)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] %(message)s"))
    logging.getLogger("rlpost").addHandler(handler)


class _HarmlessEngineWarnings(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" on every in-place weight reload.

    The rotary layer holds only a cos/sin table computed from the config, never a checkpoint weight, so
    the reload has nothing to load into it and puts the table back unchanged; the warning says nothing
    about the weights that were synced.
    """

    LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage() == "RotaryEmbedding: Failed to load weights")


def collect_stacks(workers: list[WorkerInfo], wait_s: float = 3.0) -> dict[int, str]:
    """{rank: its Python stacks now} for `workers`, by signalling each process to dump them.

    Ranks on this host are signalled from here; those on other hosts by a small Ray task placed on their node
    (their stack files are on that node's disk), all at once. Only processes that are still Ray workers are
    signalled (a pid alone could name an unrelated process); for the others the text says why there is no stack.
    """
    here = socket.gethostname()
    remote: dict[str, list[WorkerInfo]] = {}
    for worker in workers:
        if worker.host != here and worker.node_id:
            remote.setdefault(worker.node_id, []).append(worker)
    pending = {node: _dump_on_node(node, group, wait_s) for node, group in remote.items()}
    stacks = stacks_here([w for w in workers if w not in sum(remote.values(), [])], wait_s)
    for node, ref in pending.items():
        stacks.update(_remote_result(ref, remote[node], wait_s))
    return stacks


def _dump_on_node(node_id: str, workers: list[WorkerInfo], wait_s: float):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(stacks_here)
    return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
        workers, wait_s, same_host=True)


def _remote_result(ref, workers: list[WorkerInfo], wait_s: float) -> dict[int, str]:
    import ray

    try:
        return ray.get(ref, timeout=wait_s + 30)
    except Exception as err:  # noqa: BLE001 - a node that cannot run the task still gets a line per rank
        why = str(err).splitlines()[0][:200]
        return {w.rank: f"(no stack: the dump task on host {w.host} failed: {why}; there: kill -USR1 {w.pid})"
                for w in workers}


def stacks_here(workers: list[WorkerInfo], wait_s: float = 3.0, same_host: bool = False) -> dict[int, str]:
    """`collect_stacks` for processes of this host (`same_host`: the caller placed this call on their node)."""
    offsets, stacks = {}, {}
    for worker in workers:
        reason = _why_not_signal(worker, same_host)
        if reason:
            stacks[worker.rank] = f"(no stack: {reason})"
            continue
        offsets[worker.rank] = _size(worker.stack_file)
        os.kill(worker.pid, STACK_SIGNAL)
    deadline = time.monotonic() + wait_s
    by_rank = {w.rank: w for w in workers}
    while offsets and time.monotonic() < deadline:
        time.sleep(0.1)
        for rank in [r for r in offsets if _size(by_rank[r].stack_file) > offsets[r]]:
            time.sleep(0.1)  # the handler writes thread by thread: let it finish
            stacks[rank] = _read_from(by_rank[rank].stack_file, offsets.pop(rank)).rstrip()
    for rank in offsets:
        stacks[rank] = f"(no stack: pid {by_rank[rank].pid} did not write to {by_rank[rank].stack_file})"
    return stacks


def _why_not_signal(worker: WorkerInfo, same_host: bool = False) -> str | None:
    if not same_host and worker.host != socket.gethostname():
        return f"rank runs on host {worker.host}; signal pid {worker.pid} there: kill -USR1 {worker.pid}"
    try:
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {worker.pid} has exited"
    if not cmdline.startswith(b"ray::"):
        return f"pid {worker.pid} is no longer a Ray worker"
    return None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    with open(path, errors="replace") as f:
        f.seek(offset)
        return f.read()
