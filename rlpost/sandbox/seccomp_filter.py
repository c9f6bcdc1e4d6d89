"""A seccomp-bpf filter for the sandboxed program, built by hand (standard library only: the jail runs `python -I -S`).

Installed by the jail in the program's process just before execve (after no_new_privs, which the kernel requires
of an unprivileged filter); inherited by every process the program starts. What it does, per system call:

- another architecture's calling convention (x86_64's x32 ABI, a 32-bit entry) : the process is killed;
- `socket` of any family but AF_UNIX (AF_INET, AF_INET6, AF_PACKET, AF_NETLINK, ...): fails with EPERM;
- `clone` asking for a new namespace, `unshare`, `setns`, `ptrace`, `mount` and the new mount API, `kexec_*`,
  `bpf`, module loading, `reboot`, `swapon`, `keyctl`, `perf_event_open`, `userfaultfd`, `process_vm_*`,
  `io_uring_*`, ... (`DENIED`): the process is killed with SIGSYS (the jail's reason `syscall_denied`);
- `clone3` fails with ENOSYS (its flags sit behind a pointer the filter cannot read; glibc then falls back to
  `clone`, whose flags it can);
- everything else is allowed.

The kernel runs the filter (a few dozen BPF instructions) on every system call of the program.
"""

import ctypes
import os
import platform
import struct

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_ABS_W, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # struct seccomp_data; the low 32 bits of args[0] (little endian)
AF_UNIX, EPERM, ENOSYS = 1, 1, 38
X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (NEWTIME's bit is clone's exit signal)
CLONE_NS_FLAGS = 0x7E020000

# name: (x86_64, aarch64) numbers, from the kernel's unistd_64.h and asm-generic/unistd.h
DENIED = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "bpf": (321, 280),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225), "acct": (163, 89),
    "quotactl": (179, 60), "sethostname": (170, 161), "setdomainname": (171, 162),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "vhangup": (153, 58),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282), "lookup_dcookie": (212, 18),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
}
X86_ONLY = {"iopl": 172, "ioperm": 173}
# machine: (AUDIT_ARCH_*, column of DENIED, socket, clone, clone3)
ARCHES = {"x86_64": (0xC000003E, 0, 41, 56, 435), "aarch64": (0xC00000B7, 1, 198, 220, 435)}


def unavailable_reason() -> str | None:
    """Why this machine gets no filter (None: it does)."""
    machine = platform.machine()
    if machine not in ARCHES:
        return f"no seccomp filter for {machine} (built for {', '.join(sorted(ARCHES))})"
    try:
        with open("/proc/self/status") as f:
            if not any(line.startswith("Seccomp:") for line in f):
                return "the kernel has no seccomp (no Seccomp line in /proc/self/status)"
    except OSError as exc:
        return f"cannot read /proc/self/status: {exc}"
    return None


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for `machine` as (code, jt, jf, k) instructions, jumps resolved."""
    arch, column, nr_socket, nr_clone, nr_clone3 = ARCHES[machine]
    denied = sorted({nums[column] for nums in DENIED.values()} | (set(X86_ONLY.values()) if column == 0 else set()))
    # (code, true target, false target, k): a target is a label or None (the next instruction)
    code: list = [(LD_ABS_W, None, None, OFF_ARCH), (JEQ_K, None, "kill", arch), (LD_ABS_W, None, None, OFF_NR)]
    if column == 0:
        code.append((JGE_K, "kill", None, X32_BIT))
    code += [(JEQ_K, "kill", None, nr) for nr in denied]
    code += [(JEQ_K, "enosys", None, nr_clone3), (JEQ_K, "socket", None, nr_socket),
             (JEQ_K, "clone", None, nr_clone), (RET_K, None, None, RET_ALLOW),
             "socket", (LD_ABS_W, None, None, OFF_ARG0), (JEQ_K, "allow", None, AF_UNIX),
             (RET_K, None, None, RET_ERRNO | EPERM),
             "clone", (LD_ABS_W, None, None, OFF_ARG0), (JSET_K, "kill", None, CLONE_NS_FLAGS),
             "allow", (RET_K, None, None, RET_ALLOW),
             "kill", (RET_K, None, None, RET_KILL_PROCESS),
             "enosys", (RET_K, None, None, RET_ERRNO | ENOSYS)]
    labels, insns = {}, []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)

    def offset(at: int, target: str | None) -> int:
        return 0 if target is None else labels[target] - at - 1

    return [(op, offset(i, jt), offset(i, jf), k) for i, (op, jt, jf, k) in enumerate(insns)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(libc: ctypes.CDLL) -> None:
    """Load the filter into this process (no_new_privs must be set); OSError when the kernel refuses it."""
    insns = program(platform.machine())
    raw = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *insn) for insn in insns))
    prog = _SockFprog(len(insns), ctypes.cast(raw, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
