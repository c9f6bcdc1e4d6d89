"""The sandbox's seccomp filter: its BPF program read by a small interpreter of classic BPF against the table of
what each system call should get, and hostile programs through the real service (killed with their reason, or
EPERM), while ordinary programs (threads, subprocesses, AF_UNIX sockets) still pass."""

import json
import platform
import struct

import pytest

from rlpost.reward.score.code import compute_score
from rlpost.sandbox import seccomp_filter as sf
from rlpost.sandbox.client import run_code

TESTS = json.dumps({"inputs": ["5\n"], "outputs": ["5\n"]})
KILL, ALLOW, EPERM, ENOSYS = sf.RET_KILL_PROCESS, sf.RET_ALLOW, sf.RET_ERRNO | 1, sf.RET_ERRNO | 38
# read, write, close, mmap, execve, exit, exit_group, openat (unistd_64.h, asm-generic/unistd.h)
ORDINARY = {"x86_64": (0, 1, 3, 9, 59, 60, 231, 257), "aarch64": (63, 64, 57, 222, 221, 93, 94, 56)}
needs_filter = pytest.mark.skipif(sf.unavailable_reason() is not None, reason=str(sf.unavailable_reason()))


def run_bpf(insns: list[tuple[int, int, int, int]], arch: int, nr: int, arg0: int = 0) -> int:
    """Classic BPF over a packed struct seccomp_data (nr, arch, ip, args): the value of the RET reached."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.timeout(10)
@pytest.mark.parametrize("machine", sorted(sf.ARCHES))
def test_filter_gives_each_call_its_action(machine):
    arch, column, nr_socket, nr_clone, nr_clone3 = sf.ARCHES[machine]
    insns = sf.program(machine)
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in insns)
    for name, numbers in sf.DENIED.items():
        assert run_bpf(insns, arch, numbers[column]) == KILL, name
    assert run_bpf(insns, arch, nr_socket, arg0=1) == ALLOW  # AF_UNIX
    for family in (2, 10, 16, 17):  # AF_INET, AF_INET6, AF_NETLINK, AF_PACKET
        assert run_bpf(insns, arch, nr_socket, arg0=family) == EPERM
    assert run_bpf(insns, arch, nr_clone, arg0=0x01200011) == ALLOW  # glibc fork(): SIGCHLD | SETTID | CLEARTID
    assert run_bpf(insns, arch, nr_clone, arg0=0x003D0F00) == ALLOW  # pthread_create's flags
    for ns_flag in (0x20000, 0x10000000, 0x20000000, 0x40000000):  # NEWNS, NEWUSER, NEWPID, NEWNET
        assert run_bpf(insns, arch, nr_clone, arg0=0x11 | ns_flag) == KILL
    assert run_bpf(insns, arch, nr_clone3) == ENOSYS
    for nr in ORDINARY[machine]:
        assert run_bpf(insns, arch, nr) == ALLOW
    other = 0x40000003 if machine == "x86_64" else 0xC000003E
    assert run_bpf(insns, other, 0) == KILL  # another architecture's calling convention
    if machine == "x86_64":
        assert run_bpf(insns, arch, 0x40000000 | 101) == KILL  # x32 ptrace
        assert run_bpf(insns, arch, 172) == KILL  # iopl


def score(sandbox, program: str) -> dict:
    return compute_score(sandbox.url, f"```python\n{program}\n```", TESTS, timeout=10, memory_limit_mb=256)


SYSCALL = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
HOSTILE = {  # the call the program makes, through libc or the raw system call number
    "ptrace": "libc.ptrace(16, 1, 0, 0)",  # PTRACE_ATTACH to PID 1
    "mount": "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)",
    "unshare": "libc.unshare(0x10000000)",
    "kexec_load": f"libc.syscall({sf.DENIED['kexec_load'][0]}, 0, 0, 0, 0)",
    "bpf": f"libc.syscall({sf.DENIED['bpf'][0]}, 0, 0, 0)",
    "clone_newnet": "import os\nlibc.syscall(56, 0x40000011, 0, 0, 0, 0)",
}


@needs_filter
@pytest.mark.timeout(60)
@pytest.mark.skipif(platform.machine() != "x86_64", reason="raw system call numbers of x86_64")
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_denied_calls_kill_the_program(sandbox, name):
    program = SYSCALL + HOSTILE[name] + "\nprint(input())"
    assert score(sandbox, program) == {"score": 0.0, "sandbox_pass_rate": 0.0, "sandbox_status": "syscall_denied",
                                       "sandbox_seconds": pytest.approx(0.1, abs=5.0)}
    raw = run_code(sandbox.url, program, "5")
    assert (raw["reason"], raw["run_result"]["return_code"], raw["run_result"]["stdout"]) == ("syscall_denied", -31, "")


@needs_filter
@pytest.mark.timeout(30)
def test_inet_sockets_get_eperm(sandbox):
    program = "import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\nprint(input())"
    assert score(sandbox, program)["sandbox_status"] == "runtime_error"
    raw = run_code(sandbox.url, "import socket\nfor f in (socket.AF_INET, socket.AF_INET6):\n    try:\n"
                                "        socket.socket(f)\n    except PermissionError as e:\n        print(e.errno)")
    assert raw["run_result"]["stdout"] == "1\n1\n"


@needs_filter
@pytest.mark.timeout(30)
def test_ordinary_programs_still_pass(sandbox):
    program = ("import socket, subprocess, sys, threading\nout = []\nt = threading.Thread(target=out.append, "
               "args=(input(),))\nt.start()\nt.join()\na, b = socket.socketpair()\na.sendall(out[0].encode())\n"
               "echo = subprocess.run([sys.executable, '-c', 'print(input())'], input=b.recv(9), "
               "capture_output=True)\nprint(echo.stdout.decode().strip())")
    assert score(sandbox, program)["score"] == 1.0
