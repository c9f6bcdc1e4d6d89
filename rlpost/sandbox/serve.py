"""The sandbox service: SandboxFusion's HTTP API over rlpost's jail.

    python -m rlpost.sandbox.serve --port 8080 [--host 127.0.0.1] [--workers 2] [--queue 256]

`POST /run_code` takes SandboxFusion's `RunCodeRequest` (language, code, stdin, compile_timeout, run_timeout,
memory_limit_MB, files, fetch_files) and answers its `RunCodeResponse` (see `rlpost.sandbox.runner`).
`GET /v1/ping` answers "pong"; `GET /health` the languages, limits and counters. At most `--workers`
programs run at once; up to `--queue` more wait, beyond that a request gets HTTP 429 (clients retry).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from typing import Any

from pydantic import BaseModel, Field

from rlpost.sandbox.runner import Limits, Runner, SandboxUnavailable, sandbox_error

PROBE = "print(6 * 7)"


class RunCodeRequest(BaseModel):
    """SandboxFusion's request body (fields verl's client sends; others are accepted and ignored)."""

    code: str
    language: str = "python"
    stdin: str | None = None
    compile_timeout: float = Field(10, gt=0, le=600)
    run_timeout: float = Field(10, gt=0, le=600)
    memory_limit_MB: int = Field(1024, gt=0, le=65536)
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


def build_app(runner: Runner, workers: int, queue: int) -> Any:
    """The FastAPI app; `workers` programs at once, `queue` waiting."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = FastAPI(title="rlpost sandbox")
    slots = asyncio.Semaphore(workers)
    counters = {"running": 0, "waiting": 0, "served": 0, "rejected": 0}

    @app.get("/v1/ping")
    async def ping() -> PlainTextResponse:
        return PlainTextResponse("pong")

    @app.get("/health")
    async def health() -> dict:
        return {"languages": runner.languages(), "workers": workers, "queue": queue, **counters}

    @app.post("/run_code")
    async def run_code(req: RunCodeRequest) -> Any:
        if req.language not in runner.languages():
            return sandbox_error(f"language {req.language!r} is not supported by this sandbox (supported: "
                                 f"{', '.join(runner.languages())}; cpp needs g++ on the service's machine)")
        if slots.locked() and counters["waiting"] >= queue:
            counters["rejected"] += 1
            return JSONResponse({"detail": f"sandbox queue full ({queue} waiting, {workers} running); retry later"},
                                status_code=429)
        counters["waiting"] += 1
        try:
            await slots.acquire()
        finally:
            counters["waiting"] -= 1
        counters["running"] += 1
        try:
            return await runner.run(req.model_dump())
        finally:
            counters["running"] -= 1
            counters["served"] += 1
            slots.release()

    return app


def probe(runner: Runner) -> None:
    """Run one program before serving: the service refuses to start without working isolation."""
    result = asyncio.run(runner.run({"language": "python", "code": PROBE, "run_timeout": 10, "memory_limit_MB": 512}))
    out = (result.get("run_result") or {}).get("stdout", "")
    if result["status"] != "Success" or out.strip() != "42":
        raise SandboxUnavailable(
            "the sandbox cannot isolate programs on this machine (it needs unprivileged user namespaces: "
            f"sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces>0): {result.get('message')!r}")


def main(argv: list[str] | None = None) -> int:
    """Start the service (blocks); `--port 0` picks a free port, written to `--port-file` when given."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m rlpost.sandbox.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--port-file", default=None, help="write the bound port here once serving")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="programs run at once")
    parser.add_argument("--queue", type=int, default=1024, help="requests that may wait for a worker")
    parser.add_argument("--max-processes", type=int, default=Limits.nproc, help="RLIMIT_NPROC per program")
    parser.add_argument("--max-output-mb", type=int, default=Limits.fsize_mb, help="RLIMIT_FSIZE per program")
    parser.add_argument("--no-seccomp", action="store_true", help="run programs without the seccomp filter")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.queue < 0:
        parser.error(f"--workers must be >= 1 and --queue >= 0 (got {args.workers}, {args.queue}); e.g. --workers 2")
    try:
        runner = Runner(limits=Limits(nproc=args.max_processes, fsize_mb=args.max_output_mb,
                                     seccomp=not args.no_seccomp))
        probe(runner)
    except SandboxUnavailable as err:
        print(f"sandbox: {err}", file=sys.stderr)
        return 2
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        print(f"sandbox: cannot listen on {args.host}:{args.port}: {err}; pick another --port (0: any free one)",
              file=sys.stderr)
        return 2
    sock.listen(2048)  # connections wait in the backlog until the server accepts: the port file may go out now
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(runner, args.workers, args.queue), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    print(f"sandbox: serving http://{args.host}:{port}/run_code ({', '.join(runner.languages())}; "
          f"{args.workers} at once; seccomp filter: {runner.seccomp_off or 'on'})", flush=True)
    if args.port_file:
        tmp = f"{args.port_file}.tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    try:
        server.run(sockets=[sock])
    finally:
        runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
