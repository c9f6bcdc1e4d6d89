"""Run one SandboxFusion `/run_code` request in the jail (`rlpost.sandbox.jail`) and build its response.

Each program goes to the jail's zygote (one warm process per service, on an abstract Unix socket: no file); its
handler enters new user, network, PID and mount namespaces. A backstop kills the handler (and with it the
namespace) if it overruns its limits by `GRACE_S`.

Response (SandboxFusion's `RunCodeResponse`): `status` Success | Failed | SandboxError, `message`,
`compile_result` / `run_result` (`status` Finished | TimeLimitExceeded, `execution_time`, `return_code`,
`stdout`, `stderr`), `files`; rlpost adds `reason` (ok, wall_time, cpu_time, memory, output_limit,
syscall_denied, runtime_error, compile_error, sandbox_error) at the top and in each stage result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from rlpost.sandbox import seccomp_filter

JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail.py")
GRACE_S = 5.0
LANGUAGES = ("python", "cpp")


class SandboxUnavailable(RuntimeError):
    """The isolation this machine must give is not there (the service refuses to start)."""


def _python() -> str:
    """The base interpreter (a venv's site-packages stay out of the program's view)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _secret_etc_files() -> list[str]:
    """Files under /etc that are not world-readable (shadow, gshadow, keys): covered inside the jail."""
    found = []
    for root, _dirs, files in os.walk("/etc"):
        for name in files:
            path = os.path.join(root, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and not mode & stat.S_IROTH:
                found.append(path)
    return found


@dataclass
class Limits:
    """Per-program limits; `memory_mb` and the time-outs come from each request."""

    nproc: int = 64
    fsize_mb: int = 16
    nofile: int = 64
    output_bytes: int = 1 << 20
    tmp_mb: int = 64
    seccomp: bool = True  # the filter of rlpost.sandbox.seccomp_filter, where the machine has one


@dataclass
class Runner:
    """Builds jail requests; one per service (the /etc scan and tool lookup happen once)."""

    limits: Limits = field(default_factory=Limits)
    python: str = field(default_factory=_python)
    gxx: str | None = field(default_factory=lambda: shutil.which("g++"))
    mask: list[str] = field(default_factory=_secret_etc_files)

    def __post_init__(self) -> None:
        prefix = os.path.dirname(os.path.dirname(self.python))
        self.keep = sorted({prefix, os.path.dirname(os.path.realpath(self.gxx)) if self.gxx else prefix})
        self.seccomp_off = seccomp_filter.unavailable_reason() if self.limits.seccomp else "turned off"
        self.address = f"rlpost-sandbox-{os.getpid()}-{secrets.token_hex(6)}"
        self._zygote: subprocess.Popen | None = None
        self._start_zygote()

    def _start_zygote(self) -> None:
        """The jail's zygote (one warm process forking a handler per program), tied to this process's life."""
        self.close()
        self._zygote = subprocess.Popen([self.python, "-I", "-S", JAIL, self.address], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        if self._zygote.stdout.readline().strip() != b"ready":
            raise SandboxUnavailable(f"the sandbox's jail did not start: {self._zygote.stderr.read().decode()[-500:]}")

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        # connected by hand: not every event loop takes an abstract socket name as a path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, "\0" + self.address)
        except OSError:
            sock.close()
            raise
        return await asyncio.open_unix_connection(sock=sock)

    def close(self) -> None:
        """Stop the zygote (running programs end with their handlers)."""
        if self._zygote is not None and self._zygote.poll() is None:
            self._zygote.kill()
            self._zygote.wait()

    def languages(self) -> list[str]:
        return [lang for lang in LANGUAGES if lang == "python" or self.gxx]

    def jail_request(self, req: dict[str, Any]) -> dict[str, Any]:
        """The jail's input for a validated `/run_code` body."""
        language = req["language"]
        memory_mb = int(req.get("memory_limit_MB") or 1024)
        run_timeout = float(req.get("run_timeout") or 10)
        base = {"code": req["code"], "stdin": req.get("stdin") or "", "files": req.get("files") or {},
                "fetch_files": req.get("fetch_files") or [], "keep": self.keep, "mask": self.mask,
                "tmp_mb": self.limits.tmp_mb + 2 * self.limits.fsize_mb,
                "compile_timeout": float(req.get("compile_timeout") or 10), "run_timeout": run_timeout,
                "limits": {"cpu_s": max(int(run_timeout + 0.999), 1), "memory_mb": memory_mb,
                           "nproc": self.limits.nproc, "fsize_mb": self.limits.fsize_mb,
                           "nofile": self.limits.nofile, "output_bytes": self.limits.output_bytes,
                           "seccomp": self.seccomp_off is None}}
        if language == "python":
            return {**base, "source_name": "main.py", "run": [self.python, "-I", "main.py"]}
        return {**base, "source_name": "main.cpp", "run": ["./main"],
                "compile": [self.gxx, "-O2", "-std=c++17", "-o", "main", "main.cpp"]}

    async def run(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run a `/run_code` body (language already checked); the SandboxFusion response."""
        jail_req = self.jail_request(req)
        budget = jail_req["run_timeout"] + (jail_req["compile_timeout"] if "compile" in jail_req else 0) + GRACE_S
        try:
            reader, writer = await self._connect()
        except OSError:  # the zygote died (killed from outside): start another
            self._start_zygote()
            reader, writer = await self._connect()
        writer.write(json.dumps(jail_req).encode())
        writer.write_eof()
        handler = None
        try:
            handler = int(await asyncio.wait_for(reader.readline(), GRACE_S))
            out = await asyncio.wait_for(reader.read(), budget)
        except (asyncio.TimeoutError, ValueError):
            if handler is not None:  # its namespace's processes follow it (parent-death signals)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(handler, signal.SIGKILL)
            return sandbox_error(f"the jail did not finish within {budget:.0f} s and was killed")
        finally:
            writer.close()
        try:
            result = json.loads(out.decode())
        except ValueError:
            return sandbox_error(f"the jail ended without a result ({len(out)} bytes of output)")
        return to_response(result)


def sandbox_error(message: str) -> dict[str, Any]:
    return {"status": "SandboxError", "message": message, "reason": "sandbox_error", "compile_result": None,
            "run_result": None, "executor_pod_name": None, "files": {}}


def to_response(result: dict[str, Any]) -> dict[str, Any]:
    """The jail's result as SandboxFusion's response."""
    if "error" in result:
        return sandbox_error(result["error"])
    compiled, run = result["compile_result"], result["run_result"]
    if compiled is not None and compiled["return_code"] != 0:
        reason = "compile_timeout" if compiled["reason"] == "wall_time" else "compile_error"
        status, message = "Failed", f"compilation failed ({compiled['reason']})"
    else:
        reason = run["reason"]
        status = "Success" if reason == "ok" else "Failed"
        message = "" if reason == "ok" else f"run failed: {reason}"
    return {"status": status, "message": message, "reason": reason, "compile_result": compiled, "run_result": run,
            "executor_pod_name": None, "files": result.get("files") or {}}
