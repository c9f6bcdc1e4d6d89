"""Hostile programs through the code scorer and the real service: each scores 0.0 with its reason, the service
keeps answering, and nothing is left behind (no process under the service, no file the program wrote)."""

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from rlpost.reward.score.code import compute_score
from rlpost.sandbox.client import run_code
from rlpost.sandbox.jail import BOX

TESTS = json.dumps({"inputs": ["5\n"], "outputs": ["5\n"]})  # the right program prints its input back
pytestmark = pytest.mark.usefixtures("nothing_left")


def score(sandbox, program: str, timeout: float = 10.0, memory_limit_mb: int = 256) -> dict:
    return compute_score(sandbox.url, f"```python\n{program}\n```", TESTS, timeout=timeout,
                         memory_limit_mb=memory_limit_mb)


def still_serving(sandbox) -> None:
    result = run_code(sandbox.url, "print(input())", "ok")
    assert (result["status"], result["run_result"]["stdout"]) == ("Success", "ok\n")


def test_the_right_program_scores_one(sandbox):
    assert score(sandbox, "print(input())", timeout=10) == {"score": 1.0, "sandbox_pass_rate": 1.0, "sandbox_status": "passed",
                                                "sandbox_seconds": pytest.approx(0.1, abs=2.0)}


def test_infinite_loop_is_stopped_at_the_wall_limit(sandbox):
    start = time.monotonic()
    result = score(sandbox, "while True:\n    pass", timeout=1)
    assert (result["score"], result["sandbox_status"]) == (0.0, "wall_time")
    assert time.monotonic() - start < 6
    still_serving(sandbox)


def test_sleep_past_the_wall_limit(sandbox):
    start = time.monotonic()
    result = score(sandbox, "import time\ntime.sleep(100)", timeout=1)
    assert (result["score"], result["sandbox_status"]) == (0.0, "wall_time")
    assert time.monotonic() - start < 6


def test_fork_bomb_is_bounded_and_cleaned_up(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    assert score(sandbox, bomb, timeout=1)["sandbox_status"] == "wall_time"
    # RLIMIT_NPROC (64): of 200 sleeping children most cannot start
    counter = ("import os, time\nok = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
               "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
               "    ok += 1\nprint(ok)")
    started = int(run_code(sandbox.url, counter, run_timeout=5)["run_result"]["stdout"])
    assert 1 <= started < 64
    still_serving(sandbox)


def test_memory_hog_is_refused_its_memory(sandbox):
    result = score(sandbox, "x = bytearray(2 << 30)\nprint(input())", memory_limit_mb=256)
    assert (result["score"], result["sandbox_status"]) == (0.0, "memory")


def test_huge_output_is_cut_at_the_file_size_limit(sandbox):
    result = score(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", timeout=5)
    assert (result["score"], result["sandbox_status"]) == (0.0, "output_limit")
    raw = run_code(sandbox.url, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", run_timeout=5)
    assert len(raw["run_result"]["stdout"]) == 1 << 20  # what comes back is capped too


def test_writes_outside_the_working_directory_fail_or_vanish(sandbox, tmp_path):
    here = tmp_path / f"evil-{uuid.uuid4().hex}"
    in_tmp = f"/tmp/evil-{uuid.uuid4().hex}"
    program = (f"open({in_tmp!r}, 'w').write('x')\n"  # the namespace's own /tmp: gone with it
               f"open({str(here)!r}, 'w').write('x')")   # a host folder: hidden, read-only
    result = score(sandbox, program)
    assert (result["score"], result["sandbox_status"]) == (0.0, "runtime_error")
    assert not here.exists() and not os.path.exists(in_tmp)
    raw = run_code(sandbox.url, "open('/usr/evil', 'w')")
    assert "Read-only file system" in raw["run_result"]["stderr"]


def test_trainer_files_and_shadow_are_not_readable(sandbox):
    this_file = Path(__file__).resolve()
    program = (f"import os\nprint(os.path.exists({str(this_file)!r}), repr(open('/etc/shadow').read()))\n"
               f"print(os.path.exists({str(this_file.parents[2])!r}), os.listdir('/' + {this_file.parts[1]!r}))")
    raw = run_code(sandbox.url, program)
    # hidden by an empty tmpfs (a checkout under /tmp shows only the program's own box there); shadow covered
    box = [BOX.split("/")[2]] if BOX.split("/")[1] == this_file.parts[1] else []
    assert raw["run_result"]["stdout"] == f"False ''\nFalse {box}\n"
    assert score(sandbox, f"print(open({str(this_file)!r}).read())")["sandbox_status"] == "runtime_error"


def test_network_is_unreachable(sandbox):
    port = int(sandbox.url.split(":")[2].split("/")[0])
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint(input())"
    result = score(sandbox, program)
    assert (result["score"], result["sandbox_status"]) == (0.0, "runtime_error")
    raw = run_code(sandbox.url, program, "5")
    # the seccomp filter refuses the AF_INET socket itself; without it the empty network namespace has no route
    assert any(m in raw["run_result"]["stderr"] for m in ("Operation not permitted", "Network is unreachable"))


def test_killing_the_parent_and_the_service_does_nothing(sandbox):
    program = (f"import os, signal\nfor pid in (os.getppid(), 1):\n    os.kill(pid, signal.SIGKILL)\n"
               f"try:\n    os.kill({sandbox.pid}, signal.SIGKILL)\nexcept ProcessLookupError:\n    print('no such')\n"
               "raise SystemExit(3)")
    raw = run_code(sandbox.url, program)
    assert (raw["status"], raw["run_result"]["return_code"], raw["run_result"]["stdout"]) == ("Failed", 3, "no such\n")
    assert score(sandbox, program)["sandbox_status"] == "runtime_error"
    still_serving(sandbox)


def test_children_left_behind_are_killed(sandbox):
    """A daemon (own session, double fork) outliving the program: killed when the run ends (the fixture checks no
    process remains under the service); the program's own output still scores."""
    program = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(300)\n"
               "    os._exit(0)\nprint(input())")
    assert score(sandbox, program, timeout=10)["score"] == 1.0


def test_a_slow_sample_holds_only_its_own_slot(sandbox):
    """With 2 workers, a fast program finishes while a sleeping one holds the other slot."""
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(run_code, sandbox.url, "import time\ntime.sleep(4)", run_timeout=6)
        time.sleep(0.3)
        start = time.monotonic()
        fast = run_code(sandbox.url, "print(7)")
        fast_s = time.monotonic() - start
        assert fast["run_result"]["stdout"] == "7\n" and fast_s < 2.5
        assert slow.result()["status"] == "Success"
