"""A worker that stops answering explains itself: after `stall_timeout_s` the driver logs the Python stack
of every rank that has not answered (rank, role, phase), and the time-out error carries the stacks too.
With quiet logs, a worker's own output goes to its log file under the run folder, not the console."""

import io
import logging
import os
import signal
import sys
import time

import pytest

from rlpost.single_controller.base import Dispatch, Worker, register

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(180)

from rlpost.single_controller.ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerGroupError,
    WorkerGroupTimeoutError,
    finish_ray,
    init_ray,
)


class SlowStartWorker(Worker):
    def __init__(self, seconds: float):
        super().__init__()
        time.sleep(seconds)  # a model load or a process group that hangs: the stack must show this line

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ready(self):
        return self.rank


class NapWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nap(self, seconds_by_rank: dict):
        seconds = seconds_by_rank.get(self.rank, 0.0)
        if seconds:
            time.sleep(seconds)  # the stack must show this line
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int):
        if self.rank == rank:
            print("engine: the last words before the error", flush=True)
            raise RuntimeError(f"engine failure on rank {rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def nap_or_die(self, die_rank: int, nap_s: float):
        """Rank `die_rank` ends its process as a SIGKILL would; the others nap (a peer left waiting)."""
        if self.rank == die_rank:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(nap_s)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def chatter(self):
        print("engine INFO line that belongs in the log file", flush=True)
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").warning(
            "%s: Failed to load weights", "RotaryEmbedding")
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").warning(
            "%s: Failed to load weights", "Linear")
        return os.getpid()


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import test modules
    log_dir = tmp_path_factory.mktemp("run") / "logs"
    init_ray({"num_cpus": 3}, log_dir=str(log_dir), verbose=False)  # 2 for this group, 1 for a hung start-up
    wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(NapWorker), name_prefix="actor",
                        call_timeout_s=60.0, stall_timeout_s=1.0)
    yield wg, log_dir
    wg.shutdown()
    finish_ray({})


def test_stalled_rank_logs_its_stack_then_answers(group, caplog):
    wg, _ = group
    with caplog.at_level(logging.WARNING, logger="rlpost.single_controller.ray.errors"):
        assert wg.nap({1: 3.0}) == [0, 1]  # a slow phase is reported, not failed
    report = "\n".join(r.getMessage() for r in caplog.records)
    assert "actor.nap has run for 1 s (trainer.ray_stall_timeout); rank(s) [1] have not answered" in report
    assert "it fails at trainer.ray_call_timeout=60 s" in report
    assert "--- rank 1 (role actor, phase nap) ---" in report and "rank 0 (" not in report
    assert 'line' in report and "in nap" in report  # faulthandler: File "...", line N in nap


def test_a_hang_while_workers_start_logs_their_stacks(group, caplog):
    with caplog.at_level(logging.WARNING, logger="rlpost.single_controller.ray.errors"):
        slow = RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(SlowStartWorker, 3.0),
                              name_prefix="critic", stall_timeout_s=1.0)
    try:
        assert slow.ready() == [0]  # slow, not failed
    finally:
        slow.shutdown()
    report = "\n".join(r.getMessage() for r in caplog.records)
    assert "critic.__init__ has run for 1 s (trainer.ray_stall_timeout); rank(s) [0] have not answered" in report
    assert "--- rank 0 (role critic, phase __init__) ---" in report and "in __init__" in report


def test_ranks_on_another_host_are_dumped_by_a_task_on_their_node(group):
    import dataclasses

    from rlpost.single_controller.ray.diagnostics import collect_stacks

    wg, _ = group
    # as a multi-node run's driver sees them: another host's processes, whose pids mean nothing here
    elsewhere = [dataclasses.replace(w, host="another-host") for w in wg.workers]
    assert all(w.node_id for w in elsewhere)
    pending = wg.nap_or_die(-1, 10.0)  # both ranks busy in a nap, not answering calls
    try:
        # The call reaches the ranks after a moment that grows with the host's load: dump until both are in it.
        deadline = time.monotonic() + 8.0
        stacks = collect_stacks(elsewhere)
        while not all("in nap_or_die" in s for s in stacks.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
            stacks = collect_stacks(elsewhere)
    finally:
        assert pending.get() == [0, 1]
    assert set(stacks) == {0, 1} and all("in nap_or_die" in s for s in stacks.values()), stacks


def test_hung_rank_times_out_with_its_stack(group):
    wg, _ = group
    wg.call_timeout_s, wg.stall_timeout_s = 1.5, None
    start = time.monotonic()
    try:
        with pytest.raises(WorkerGroupTimeoutError) as info:
            wg.nap({0: 4.0, 1: 4.0})
    finally:
        wg.call_timeout_s, wg.stall_timeout_s = 60.0, 1.0
    assert time.monotonic() - start < 10
    text = str(info.value)
    assert "actor.nap timed out after 1.5 s (trainer.ray_call_timeout); rank(s) [0, 1] have not answered" in text
    for rank in (0, 1):
        assert f"--- rank {rank} (role actor, phase nap) ---" in text
    assert set(info.value.stacks) == {0, 1} and all("in nap" in s for s in info.value.stacks.values())
    assert wg.nap({}) == [0, 1]  # queued behind the naps, then answers


def test_quiet_worker_output_goes_to_its_log_file(group):
    wg, log_dir = group
    pids = wg.chatter()
    for rank, pid in enumerate(pids):
        text = (log_dir / f"worker_actor_rank{rank}_pid{pid}.log").read_text()  # the group's name first
        assert "engine INFO line that belongs in the log file" in text
        assert "Linear: Failed to load weights" in text
        assert "RotaryEmbedding: Failed to load weights" not in text  # harmless: the rotary table is not a weight
    assert (log_dir / "ray_driver.log").is_file()


def test_failure_names_the_log_file_of_the_failed_rank(group):
    wg, log_dir = group
    with pytest.raises(WorkerGroupError) as info:
        wg.fail_on(1)
    log_file = log_dir / f"worker_actor_rank1_pid{wg.pids[1]}.log"
    assert f"(the output of rank 1 is in {log_file})" in str(info.value)
    assert "engine failure on rank 1" in str(info.value)
    assert "engine: the last words before the error" in log_file.read_text()


def test_first_failure_of_calls_waiting_on_each_other_raises_at_once_and_the_dead_rank_is_named(group):
    """Rank 0 naps 30 s (a sender blocked on its dead peer), rank 1 dies: fetched in order the napping call would
    hold the error back 30 s; `get_together` raises rank 1's within seconds and `dead_workers` names rank 1 only
    (rank 0, busy, does not answer its ping and counts as alive). Last in this module: it ends a worker."""
    from rlpost.protocol import DataProtoFuture
    from rlpost.single_controller.ray.errors import Gatherer, get_together

    wg, _ = group
    both = wg.nap_or_die(1, 30.0)  # one future per rank, as a sender's and a receiver's group would give
    sender, receiver = (DataProtoFuture(list, [ref], fetch_fn=Gatherer("actor", "nap_or_die", [rank], 60.0, None,
                                                                       wg.workers))
                        for rank, ref in enumerate(both.futures))
    start = time.monotonic()
    with pytest.raises(WorkerGroupError) as info:
        get_together([sender, receiver])
    assert time.monotonic() - start < 15
    assert info.value.failures.keys() == {1} and "died" in str(info.value)
    dead = wg.dead_workers(wait_s=2.0)
    assert list(dead) == [1] and "died" in dead[1]


def test_the_progress_bar_stays_out_of_a_captured_log():
    from rlpost.utils.tracking import StepProgress

    log = io.StringIO()  # a file or a pipe: no terminal
    bar = StepProgress(total_steps=20, file=log)
    for _ in range(20):
        bar.update(metrics={"critic/score/mean": 0.5})
    bar.close()
    assert bar.n == 20 and log.getvalue() == ""  # the per-step lines already say how far the run is
