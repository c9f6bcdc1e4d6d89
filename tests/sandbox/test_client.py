"""The client and the service's edges: verl's own request shape, a bad URL, a full queue, a service that dies
mid-run, the cross-process limit on programs in flight, and the trainer's `url=local` start and stop."""

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import pytest

from rlpost.sandbox.client import SandboxSlots, SandboxUnreachable, run_code
from rlpost.sandbox.local import LocalSandbox


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_verl_payload_and_the_fields_verl_reads(sandbox):
    """The body verl's `call_sandbox_api` posts (requests, its exact keys) and the keys its check reads."""
    import requests

    payload = {"compile_timeout": 10, "run_timeout": 10, "code": "import sys\nprint(sys.stdin.read().upper())",
               "stdin": "abc", "memory_limit_MB": 512, "language": "python", "files": {}, "fetch_files": []}
    response = requests.post(sandbox.url, data=json.dumps(payload), timeout=30,
                             headers={"Content-Type": "application/json", "Accept": "application/json"})
    body = response.json()
    assert response.status_code == 200 and body["status"] == "Success" and body["compile_result"] is None
    run = body["run_result"]
    assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == ("Finished", 0, "ABC\n", "")
    assert 0 < run["execution_time"] < 10
    assert requests.get(sandbox.url.replace("/run_code", "/v1/ping"), timeout=10).text == "pong"


def test_files_in_and_out(sandbox):
    import base64

    body = {"code": "print(open('data.txt').read().strip()); open('out.txt', 'w').write('hi')", "language": "python",
            "files": {"data.txt": base64.b64encode(b"from a file\n").decode()}, "fetch_files": ["out.txt"]}
    import httpx

    result = httpx.post(sandbox.url, json=body, timeout=30).json()
    assert result["run_result"]["stdout"] == "from a file\n"
    assert base64.b64decode(result["files"]["out.txt"]) == b"hi"


def test_bad_url_is_one_message_naming_the_key():
    url = f"http://127.0.0.1:{free_port()}/run_code"
    start = time.monotonic()
    with pytest.raises(SandboxUnreachable, match=r"reward_model.sandbox_fusion.url='http://127.0.0.1:\d+/run_code' "
                                                 r"did not answer \(ConnectError"):
        run_code(url, "print(1)", deadline_s=1.0)
    assert time.monotonic() - start < 5


def test_full_queue_is_retried_until_a_worker_is_free():
    service = LocalSandbox(workers=1, queue=0)
    try:
        import concurrent.futures as cf
        import httpx

        with cf.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(run_code, service.url, "import time\ntime.sleep(2)\nprint('slow')", run_timeout=5)
            time.sleep(0.5)
            fast = run_code(service.url, "print('fast')")  # 429 first (nothing may wait), then retried
            assert fast["run_result"]["stdout"] == "fast\n"
            assert slow.result()["run_result"]["stdout"] == "slow\n"
        health = httpx.get(service.url.replace("/run_code", "/health"), timeout=10).json()
        assert health["rejected"] >= 1 and health["served"] == 2
    finally:
        service.stop()


def test_a_service_that_dies_mid_run_is_restarted_and_the_request_answered():
    service = LocalSandbox(workers=1)
    try:
        first = service.pid
        os.kill(first, 9)
        result = run_code(service.url, "print(40 + 2)")
        assert result["run_result"]["stdout"] == "42\n"
        assert service.restarts == 1 and service.pid != first
    finally:
        service.stop()
    assert service._proc.poll() is not None


def _hold(slots: SandboxSlots, log: str) -> None:
    with slots:
        start = time.monotonic()
        time.sleep(0.4)
        with open(log, "a") as f:
            f.write(f"{start} {time.monotonic()}\n")


def test_slots_bound_requests_across_processes(tmp_path):
    slots = SandboxSlots(2, f"test-{tmp_path.name}")
    log = str(tmp_path / "log")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_hold, args=(slots, log)) for _ in range(5)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    spans = [tuple(map(float, line.split())) for line in open(log)]
    assert len(spans) == 5
    # the most spans open at one instant: at each start, count the spans covering it
    most = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert most <= 2


def test_serve_cli_refuses_a_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "rlpost.sandbox.serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"sandbox: cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr


def test_trainer_starts_local_and_stops_it():
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR
    from rlpost.trainer.ppo.launch import code_sandbox

    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=["reward_model.sandbox_fusion.url=local",
                                                "reward_model.sandbox_fusion.max_concurrent=1"])
    with code_sandbox(cfg) as running:
        url = running.reward_model.sandbox_fusion.url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/run_code")
        assert run_code(url, "print(5)")["run_result"]["stdout"] == "5\n"
    with pytest.raises(SandboxUnreachable):
        run_code(url, "print(5)", deadline_s=0.5)


def test_trainer_refuses_an_unreachable_url_before_starting():
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR
    from rlpost.trainer.ppo.launch import InputError, code_sandbox

    url = f"http://127.0.0.1:{free_port()}/run_code"
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=[f"reward_model.sandbox_fusion.url={url}"])
    with pytest.raises(InputError, match="did not answer"), code_sandbox(cfg):
        pass
