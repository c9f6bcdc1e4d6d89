"""Shared fixtures: a tiny model built once per session, offline settings for every test."""

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# ray.init() without an address attaches to a Ray cluster it finds running on this machine: with the suite split
# over processes (pytest-xdist, scripts/test.sh) that would be another worker's. "local" always starts one here;
# a test of a `ray start` cluster hands its address to its own subprocesses.
os.environ.setdefault("RAY_ADDRESS", "local")

# torch.distributed's rendezvous variables: a test that starts a rank in this process (a worker built in-process)
# sets them; left behind, every later subprocess inherits one MASTER_PORT, and two launches at once then collide
# (EADDRINUSE). Each test gets them back as they were before it.
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def pytest_collection_modifyitems(config, items):
    """Files with end-to-end runs first, each file's tests in their own order: split over processes
    (scripts/test.sh hands whole files out in this order), the long runs start at once and the short files fill in
    at the end, instead of one process finishing a long file alone."""
    e2e_files = {item.path for item in items if item.get_closest_marker("e2e")}
    items.sort(key=lambda item: item.path not in e2e_files)  # a stable sort: False (e2e files) first


@pytest.fixture(autouse=True, scope="module")
def _no_process_group_across_files():
    """A default process group a file's tests started in this process (an in-process worker, a benchmark's
    worker) ends with the file: the next file the same xdist process runs starts its own. An in-process vLLM
    engine's groups are left alone while an engine still holds them.

    The file's dropped in-process vLLM engines are collected here first: vLLM shuts an engine down from a
    `weakref.finalize` (tearing down the process's parallel groups), and left to the collector that would happen
    at any time, e.g. in the middle of the next file's engine, which shares those groups."""
    yield
    import gc
    import sys

    gc.collect()

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is not None and state.model_parallel_is_initialized():
        return
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _restore_dist_env():
    before = {k: os.environ.get(k) for k in _DIST_ENV}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Path of a tiny Qwen2 model + tokenizer (2 layers, hidden 128, head_dim 64), built offline."""
    from rlpost.utils.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_vl_model_dir(tmp_path_factory):
    """Path of a tiny Qwen2-VL model + processor (2 layers, hidden 128, 2 vision blocks), built offline."""
    from rlpost.utils.tiny_vl_model import build_tiny_vl_model

    return str(build_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl_model")))


@pytest.fixture(scope="session")
def sandbox():
    """A real sandbox service (`python -m rlpost.sandbox.serve`, 2 workers) on a free port; `.url`, `.pid`."""
    from rlpost.sandbox.local import LocalSandbox

    service = LocalSandbox(workers=2)
    yield service
    service.stop()
