"""Client of a SandboxFusion-compatible `/run_code` service (rlpost's or the real SandboxFusion).

`SandboxSlots` bounds the requests in flight across every process of the run (the reward manager's worker
processes included): it is a set of lock files, so it pickles into a child as its path. `run_code` retries
connection errors, HTTP 429/502/503/504 and time-outs with growing delays until its deadline, then raises
`SandboxUnreachable` naming the URL and the key that set it.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
import time
from typing import Any

URL_KEY = "reward_model.sandbox_fusion.url"
RETRY_STATUS = (429, 502, 503, 504)
RETRY_DELAYS_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_clients: dict[int, Any] = {}


class SandboxUnreachable(RuntimeError):
    """The sandbox did not answer within the retries; the message names the URL and the key."""


class SandboxSlots:
    """At most `n` holders at once across processes (flock on `n` files); a context manager like a semaphore."""

    def __init__(self, n: int, key: str):
        if n < 1:
            raise ValueError(f"reward_model.sandbox_fusion.max_concurrent must be >= 1, got {n}")
        self.n, self.key = int(n), key
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        self.folder = os.path.join(tempfile.gettempdir(), f"rlpost-sandbox-slots-{digest}-{self.n}")
        self._held: list[int] = []

    def __getstate__(self) -> dict:
        return {"n": self.n, "key": self.key, "folder": self.folder}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _held=[])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxSlots) and (self.n, self.key) == (other.n, other.key)

    def __hash__(self) -> int:
        return hash((self.n, self.key))

    def __repr__(self) -> str:
        return f"SandboxSlots(n={self.n}, key={self.key!r})"

    def __enter__(self) -> SandboxSlots:
        os.makedirs(self.folder, exist_ok=True)
        start = os.getpid() % self.n  # processes start at different slots: fewer collisions
        while True:
            for i in range(self.n):
                fd = os.open(os.path.join(self.folder, f"slot-{(start + i) % self.n}"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held.append(fd)
                return self
            time.sleep(0.002)

    def __exit__(self, *exc: Any) -> None:
        fd = self._held.pop()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _client() -> Any:
    """One HTTP client per process (a forked child must not share its parent's connections)."""
    import httpx

    pid = os.getpid()
    if pid not in _clients:
        # one INFO line per program from httpx would bury the trainer's console (Hydra logs at INFO)
        logging.getLogger("httpx").setLevel(logging.WARNING)
        _clients.clear()
        _clients[pid] = httpx.Client(timeout=None)
    return _clients[pid]


def run_code(url: str, code: str, stdin: str | None = None, *, language: str = "python", run_timeout: float = 10,
             compile_timeout: float = 10, memory_limit_mb: int = 1024, deadline_s: float | None = None,
             slots: Any = None) -> dict[str, Any]:
    """POST one program to `url`; SandboxFusion's response dict.

    Args:
        deadline_s: give up retrying after this many seconds (default: both time-outs plus 30 s).
        slots: a `SandboxSlots` (or any context manager, e.g. verl's semaphore) held around each request.

    Raises:
        SandboxUnreachable: no answer within the deadline (connection refused, time-outs, a full queue, 5xx).
    """
    import httpx

    body = {"code": code, "stdin": stdin, "language": language, "run_timeout": run_timeout,
            "compile_timeout": compile_timeout, "memory_limit_MB": memory_limit_mb, "files": {}, "fetch_files": []}
    request_timeout = run_timeout + compile_timeout + 10
    deadline = time.monotonic() + (deadline_s if deadline_s is not None else request_timeout + 30)
    last = "no attempt"
    for attempt in range(100):
        try:
            if slots is not None:
                with slots:
                    response = _client().post(url, json=body, timeout=request_timeout)
            else:
                response = _client().post(url, json=body, timeout=request_timeout)
            if response.status_code not in RETRY_STATUS:
                response.raise_for_status()
                return response.json()
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except (httpx.TransportError, ValueError) as exc:  # ValueError: a body that is not JSON
            last = f"{type(exc).__name__}: {exc}"
        except httpx.HTTPStatusError as exc:
            raise SandboxUnreachable(f"{URL_KEY}={url!r} answered {exc.response.status_code}: "
                                     f"{exc.response.text[:300]}; is it a SandboxFusion /run_code endpoint?") from exc
        delay = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
        if time.monotonic() + delay > deadline:
            break
        time.sleep(delay)
    raise SandboxUnreachable(f"the code sandbox at {URL_KEY}={url!r} did not answer ({last}); start one with "
                             "`python -m rlpost.sandbox.serve --port PORT` or set the url to local")


def check_reachable(url: str, deadline_s: float = 10.0) -> None:
    """At start-up: one tiny program must run (a bad URL fails here, before any worker starts)."""
    result = run_code(url, "print(1)", run_timeout=5, deadline_s=deadline_s)
    if result.get("status") != "Success":
        raise SandboxUnreachable(f"the code sandbox at {URL_KEY}={url!r} could not run `print(1)`: "
                                 f"{result.get('status')} {result.get('message')!r}")
