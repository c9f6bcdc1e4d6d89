"""Stopping a real run from outside: SIGTERM (what `kill` and job schedulers send) ends `main_ppo` as Ctrl-C
does, with one line saying where it stopped and which checkpoint resumes it, exit status 143, no partial
checkpoint folder and no worker process left."""

import os
import signal
import subprocess
import time

import pytest

from _e2e import command, make_data
from rlpost.checkpoint.manager import read_manifest, verify_files

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(600)
def test_sigterm_stops_the_run_naming_the_checkpoint_that_resumes_it(tmp_path, tiny_model_dir):
    make_data(tmp_path)
    run_dir = tmp_path / "run"
    cmd = command(tmp_path, tiny_model_dir, run_dir, "trainer.total_training_steps=50")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 400
        while not (run_dir / "global_step_1").is_dir() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        workers = [int(p.stem.rsplit("_pid", 1)[1]) for p in (run_dir / "logs").glob("worker_*_pid*.log")]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "[rlpost] stopped by SIGTERM during step " in err and " of 50; the newest checkpoint, " in err, err[-3000:]
    newest = max(run_dir.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    assert f"{newest} (step {newest.name.rsplit('_', 1)[1]}), is complete: run the same command again" in err
    assert "Traceback" not in err
    assert not list(run_dir.glob(".tmp_*"))  # a save the signal met was removed, not left half-written
    assert verify_files(newest, read_manifest(newest)) == []
    assert len(workers) == 2
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in workers if _alive(p)], "worker processes outlived the stopped run"
