"""The process that runs one untrusted program: PID 1 of fresh user, PID, network and mount namespaces.

Started once per service by `rlpost.sandbox.runner` as `python -I -S jail.py ADDRESS` (standard library only):
a zygote that forks one handler per connection on an abstract Unix socket; the handler reads one JSON request and
answers one JSON result. The handler forks a child that calls unshare(2) for new user, mount, network
(no interface up) and PID namespaces; this process maps that namespace's uid 0 to `nobody` when the service
runs as root (root ignores RLIMIT_NPROC and owns /etc/shadow), else to the service's own user; the child's
child is PID 1 there and does the rest.

Layers, in order:
1. mount namespace made private; every top-level directory outside the system ones (`KEEP_TOP`) covered by an
   empty tmpfs, the interpreter's prefix bound back read-only, non-world-readable files of /etc covered by
   /dev/null, a fresh /proc of this PID namespace, then every mount remounted read-only;
2. a fresh tmpfs working directory `/tmp/box` (gone with the namespace: nothing is left on disk);
3. per stage (compile, run) a child in its own session with rlimits (CPU, address space, processes, file
   size, open files), no capabilities (bounding set dropped, securebits `noroot` locked, no_new_privs), no
   inherited descriptors but stdin/stdout/stderr files in the box, and the seccomp filter of
   `rlpost.sandbox.seccomp_filter` where the machine has one (no sockets but AF_UNIX; ptrace, mount, unshare,
   kexec, bpf, ... kill the program);
4. a wall-clock limit: on expiry, and after every stage, `kill(-1, SIGKILL)` ends every process of the
   namespace (PID 1 survives; when it exits the kernel kills whatever is left).
"""

import ctypes
import json
import os
import resource
import select
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `python -I` puts no script directory there
import seccomp_filter  # noqa: E402 - after the path it is found on

KEEP_TOP = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev"}
BOX = "/tmp/box"
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
OPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024,
             "nodiratime": 2048, "relatime": 1 << 21}
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 4, 24, 28, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_PDEATHSIG = 47, 4, 1
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
NOBODY = 65534
# noroot + noroot_locked + no_setuid_fixup + its lock + keep_caps_locked: uid 0 gains no capability on exec
SECUREBITS = 0b101111
LIBC = ctypes.CDLL(None, use_errno=True)


def _enc(text):
    return text.encode() if text is not None else None


def _mount(src, target, fstype, flags, data=None) -> int:
    rc = LIBC.mount(_enc(src), _enc(target), _enc(fstype), flags, _enc(data))
    return 0 if rc == 0 else ctypes.get_errno()


def _must_mount(src, target, fstype, flags, data=None) -> None:
    err = _mount(src, target, fstype, flags, data)
    if err:
        raise OSError(err, f"mount {fstype or src} on {target}: {os.strerror(err)}")


def setup_view(keep_fds: list, mask: list[str], tmp_mb: int) -> None:
    """The program's file-system view (layer 1 and 2 of the module docstring); `keep_fds`: (path, O_PATH fd)."""
    _must_mount(None, "/", None, MS_REC | MS_PRIVATE)
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name not in KEEP_TOP and os.path.isdir(path) and not os.path.islink(path):
            _must_mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path, fd in keep_fds:  # the interpreter (and compilers) living under a hidden directory
        if not os.path.isdir(path):
            os.makedirs(path)
        _must_mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    _must_mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,mode=1777")
    _must_mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
    for path in mask:
        _mount("/dev/null", path, None, MS_BIND)
    _must_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    with open("/proc/self/mountinfo") as f:
        mounts = [(line.split()[4], line.split()[5]) for line in f]
    for point, opts in mounts:
        if point == "/tmp" or point.startswith("/proc"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        flags |= sum(OPT_FLAGS.get(o, 0) for o in opts.split(","))
        _mount(None, point, None, flags)  # a mount the kernel keeps locked stays as it was (already hidden)
    os.makedirs(BOX)


def _drop_privileges() -> None:
    """In the forked child before exec: no capability can come back (the program runs as the namespace's uid 0)."""
    for cap in range(64):
        if LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if LIBC.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECUREBITS)")
    if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _child(argv: list[str], limits: dict, stdin_path: str, out_path: str, err_path: str) -> None:
    """Runs in the forked child; never returns."""
    try:
        os.setsid()
        os.chdir(BOX)
        fds = [os.open(stdin_path, os.O_RDONLY), os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
               os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        cpu = int(limits["cpu_s"])
        mem = int(limits["memory_mb"]) << 20
        for res, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                           (resource.RLIMIT_NPROC, (limits["nproc"],) * 2),
                           (resource.RLIMIT_FSIZE, (limits["fsize_mb"] << 20,) * 2),
                           (resource.RLIMIT_NOFILE, (limits["nofile"],) * 2), (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(res, value)
        _drop_privileges()
        if limits["seccomp"]:
            seccomp_filter.install(LIBC)
        os.execve(argv[0], argv, {"PATH": "/usr/bin:/bin", "HOME": BOX, "LANG": "C.UTF-8", "TMPDIR": BOX})
    except BaseException as exc:  # noqa: BLE001 - report anything, then leave without running Python's exit path
        os.write(2, f"sandbox: could not start {argv[0]}: {exc!r}\n".encode())
    os._exit(127)


def _kill_all() -> None:
    """Every process of this PID namespace but this one, reaped (again while a fork bomb still forks)."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.001)


def _read(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def run_stage(argv: list[str], stdin_text: str, timeout: float, limits: dict, name: str) -> dict:
    """Run argv in the box; SandboxFusion's `CommandRunResult` plus rlpost's `reason` and resource use."""
    stdin_path, out_path, err_path = (f"{BOX}/.{name}.{s}" for s in ("in", "out", "err"))
    with open(stdin_path, "w") as f:
        f.write(stdin_text or "")
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, limits, stdin_path, out_path, err_path)
    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([pidfd], [], [], timeout)
    timed_out = not ready
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, wstatus, usage = os.wait4(pid, 0)
    elapsed = time.monotonic() - start
    os.close(pidfd)
    _kill_all()  # children the program left behind (daemons, a fork bomb's rest)
    code = os.waitstatus_to_exitcode(wstatus)
    output_full = os.path.getsize(out_path) >= limits["fsize_mb"] << 20 or os.path.getsize(err_path) >= limits[
        "fsize_mb"] << 20
    stdout = _read(out_path, limits["output_bytes"])
    stderr = _read(err_path, limits["output_bytes"])
    reason = "output_limit" if output_full and code != 0 else _reason(timed_out, code, stderr, usage, limits)
    status = "TimeLimitExceeded" if reason in ("wall_time", "cpu_time") else "Finished"
    for path in (stdin_path, out_path, err_path):
        os.unlink(path)
    return {"status": status, "execution_time": round(elapsed, 6), "return_code": code, "stdout": stdout,
            "stderr": stderr, "reason": reason, "cpu_time": round(usage.ru_utime + usage.ru_stime, 6),
            "max_rss_mb": round(usage.ru_maxrss / 1024, 2)}


def _reason(timed_out: bool, code: int, stderr: str, usage, limits: dict) -> str:
    """Why a stage ended: ok, wall_time, cpu_time, memory, output_limit, syscall_denied, runtime_error."""
    if timed_out:
        return "wall_time"
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and usage.ru_utime + usage.ru_stime >= limits["cpu_s"]):
        return "cpu_time"
    if code == -signal.SIGXFSZ:
        return "output_limit"
    if code == -signal.SIGSYS:
        return "syscall_denied"
    if code != 0 and ("MemoryError" in stderr or "std::bad_alloc" in stderr or "Cannot allocate memory" in stderr):
        return "memory"
    return "ok" if code == 0 else "runtime_error"


def _write_files(files: dict) -> None:
    import base64

    for name, data in (files or {}).items():
        path = os.path.normpath(os.path.join(BOX, name))
        if not path.startswith(BOX + "/"):
            raise ValueError(f"file name {name!r} leaves the working directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))


def _run_request(request: dict, keep_fds: list) -> dict:
    """As PID 1 of the namespaces: set up the view, compile if needed, run; the jail's result."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores default-action signals sent from inside
    LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program may not read or trace this process
    limits = request["limits"]
    result: dict = {"compile_result": None, "run_result": None, "files": {}}
    try:
        setup_view(keep_fds, request["mask"], request["tmp_mb"])
        _write_files(request.get("files"))
        with open(os.path.join(BOX, request["source_name"]), "w") as f:
            f.write(request["code"])
        if request.get("compile"):
            compile_limits = {**limits, "cpu_s": int(request["compile_timeout"]) + 1,
                              "memory_mb": max(limits["memory_mb"], 2048), "nproc": max(limits["nproc"], 64)}
            result["compile_result"] = run_stage(request["compile"], "", request["compile_timeout"], compile_limits,
                                                 "compile")
            if result["compile_result"]["return_code"] != 0:
                return result
        result["run_result"] = run_stage(request["run"], request.get("stdin") or "", request["run_timeout"], limits,
                                         "run")
        result["files"] = _fetch(request.get("fetch_files") or [])
    except Exception as exc:  # noqa: BLE001 - the service reports it as SandboxError
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def _enter_namespaces(ready_w: int, go_r: int, host_root: bool, keep: list[str]) -> list:
    """In the forked child: new user/mount/net/PID namespaces, become their uid 0 once the parent mapped it.

    Returns (path, O_PATH fd) of the kept directories, opened in the new mount namespace (a bind mount takes no
    source from another) while this process still has the host user that can reach them."""
    if LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    keep_fds = [(path, os.open(path, os.O_PATH)) for path in keep if os.path.isdir(path)]
    os.write(ready_w, b"1")
    if os.read(go_r, 1) != b"1":
        raise OSError("the jail's parent did not map the namespace's user")
    os.setresgid(0, 0, 0)
    if host_root:  # root's supplementary groups would stay with the program
        os.setgroups([])
    os.setresuid(0, 0, 0)
    return keep_fds


def _outer_ids() -> tuple[int, int]:
    """Host uid/gid the namespace's root maps to: nobody when the service runs as root (root is exempt from
    RLIMIT_NPROC and owns /etc/shadow), else the service's own user."""
    return (NOBODY, NOBODY) if os.geteuid() == 0 else (os.geteuid(), os.getegid())


def _map_user(pid: int) -> None:
    uid, gid = _outer_ids()
    if os.geteuid() != 0:  # an unprivileged map of one's own ids must give up setgroups first
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def execute(request: dict) -> bytes:
    """Fork a child into new namespaces whose own child (PID 1 there) runs `request`; the result as JSON bytes."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    host_root = os.geteuid() == 0
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(go_w)
            LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            keep_fds = _enter_namespaces(ready_w, go_r, host_root, request["keep"])
            init = os.fork()
            if init == 0:
                LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                data = json.dumps(_run_request(request, keep_fds)).encode()
                view = memoryview(data)
                while view:
                    view = view[os.write(out_w, view):]
                os._exit(0)
            code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
        except BaseException as exc:  # noqa: BLE001 - reported as the jail's error
            os.write(out_w, json.dumps({"error": f"jail set-up: {exc!r}"}).encode())
        os._exit(code)
    for fd in (out_w, ready_w, go_r):  # a child that dies early then reads as end of file here
        os.close(fd)
    if os.read(ready_r, 1) == b"1":
        _map_user(pid)
        os.write(go_w, b"1")
    chunks = []
    while chunk := os.read(out_r, 1 << 16):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    for fd in (ready_r, go_w, out_r):
        os.close(fd)
    return b"".join(chunks) or json.dumps({"error": "the jail's namespace ended without a result"}).encode()


def _handle(conn: socket.socket) -> None:
    """One connection: send this process's pid (the service kills it on overrun), read the request until the
    client's end of writing, answer the result."""
    conn.sendall(f"{os.getpid()}\n".encode())
    chunks = []
    while chunk := conn.recv(1 << 16):
        chunks.append(chunk)
    conn.sendall(execute(json.loads(b"".join(chunks))))


def serve(address: str) -> None:
    """The zygote: accept connections on the abstract Unix socket `address`, fork one handler per connection
    (a fork of this small warm process instead of a fresh interpreter per program)."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # gone with the service
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + address)
    server.listen(1024)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers reap themselves
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the handler waits for its own children
            server.close()
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()


def _fetch(names: list[str]) -> dict:
    import base64

    out = {}
    for name in names:
        path = os.path.normpath(os.path.join(BOX, name))
        if path.startswith(BOX + "/") and os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = base64.b64encode(f.read(1 << 20)).decode()
    return out


if __name__ == "__main__":
    serve(sys.argv[1])
