"""One run per output folder: a second process asking for a held folder is refused naming the first run; the
lock goes with its holder (a killed run leaves nothing that blocks the next)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rlpost.utils.run_lock import LOCK_FILE, FolderInUse, run_lock

pytestmark = pytest.mark.timeout(60)

HOLD = ("import sys, time\nfrom rlpost.utils.run_lock import run_lock\n"
        "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n")


def test_a_second_run_on_a_held_folder_is_refused_naming_the_first(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse) as err:
            with run_lock(str(tmp_path)):
                pass
        message = str(err.value)
        assert message.startswith(f"trainer.default_local_dir={str(tmp_path)!r} is in use by another run (pid "
                                   f"{holder.pid} on ")
        assert message.endswith("give this run its own trainer.default_local_dir, or wait for that one to finish")
    finally:
        holder.kill()
        holder.wait()
    with run_lock(str(tmp_path)):  # the killed holder's lock went with it
        assert (tmp_path / LOCK_FILE).exists()


def test_the_same_process_can_take_it_again_after_release(tmp_path):
    with run_lock(str(tmp_path)):
        pass
    start = time.perf_counter()
    with run_lock(str(tmp_path)):
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()
    assert time.perf_counter() - start < 1
