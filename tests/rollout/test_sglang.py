"""SGLang engine on CPU: start-up errors, argument mapping, engine_kwargs validation, TP placement, bucketing.
The engine itself runs in tests/gpu/test_sglang_gpu.py."""

import asyncio
import os

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost.rollout import build_rollout
from rlpost.rollout.base import SamplingSpec
from rlpost.rollout.sglang_args import (ACCEPTED, check_cuda_compiler, check_extra_keys, context_length, engine_kwargs,
                                        fa3_installed, sampling_params, scheduler_devices)
from rlpost.rollout.utils import tensor_buckets
from rlpost.trainer.config.errors import ConfigError

ARR = "actor_rollout_ref"
SGL = f"{ARR}.rollout.engine_kwargs.sglang"


def _rollout_cfg(*overrides: str, name: str = "sglang"):
    """`actor_rollout_ref.rollout` of the default config on a GPU run (sglang is refused with device=cpu)."""
    return compose_config(*SMALL, "trainer.device=cuda", f"{ARR}.rollout.name={name}",
                          *overrides).actor_rollout_ref.rollout


@pytest.mark.timeout(60)
def test_choosing_sglang_without_gpu_says_what_is_needed():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        build_rollout(_rollout_cfg(), "/m", None, "cpu")


@pytest.mark.timeout(60)
def test_sglang_not_installed_names_the_install_step(monkeypatch):
    try:
        import sglang  # noqa: F401
        pytest.skip("sglang is installed")
    except ImportError:
        pass
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match=r"needs the sglang package .*gpu_bundle\.py --sglang.*gpu_install\.sh"):
        build_rollout(_rollout_cfg(), "/m", None, "cuda")


@pytest.mark.timeout(60)
def test_unknown_engine_name_lists_valid_ones():
    cfg = compose_config(*SMALL, f"{ARR}.rollout.name=vlm", validate=False).actor_rollout_ref.rollout
    with pytest.raises(ValueError, match="'vlm'.*valid"):
        build_rollout(cfg, "/m", None, "cpu")


@pytest.mark.timeout(60)
def test_engine_kwargs_mapping():
    cfg = _rollout_cfg(f"{ARR}.rollout.gpu_memory_utilization=0.6", f"{ARR}.rollout.enable_chunked_prefill=false",
                       f"{ARR}.rollout.enable_prefix_caching=false", f"{ARR}.rollout.max_num_seqs=64",
                       f"{ARR}.rollout.enforce_eager=false")
    kw = engine_kwargs(cfg, "/m", rank=0, base_gpu_id=0, fa3=False)
    assert kw["mem_fraction_static"] == 0.6 and kw["context_length"] == 16 + 8 + 2 and kw["load_format"] == "dummy"
    assert kw["tp_size"] == 1 and kw["random_seed"] == 0 and kw["enable_memory_saver"] is True
    assert kw["chunked_prefill_size"] == -1 and kw["disable_radix_cache"] is True
    assert kw["max_running_requests"] == 64 and kw["disable_cuda_graph"] is False
    assert kw["attention_backend"] == "triton" and kw["sampling_backend"] == "pytorch"
    assert kw["skip_tokenizer_init"] is True
    # SGLang clips new tokens to context - input - 2: a larger max_model_len is kept, a tight one is raised
    assert context_length(_rollout_cfg(f"{ARR}.rollout.max_model_len=24")) == 26
    assert context_length(_rollout_cfg(f"{ARR}.rollout.max_model_len=100")) == 100
    # with FA3 installed the engine picks its own attention backend
    assert "attention_backend" not in engine_kwargs(cfg, "/m", rank=0, base_gpu_id=0, fa3=True)


@pytest.mark.timeout(60)
def test_engine_kwargs_tp_seeds_ports_and_overrides():
    cfg = _rollout_cfg(f"{ARR}.rollout.tensor_model_parallel_size=2", f"{SGL}.attention_backend=fa3",
                       f"{SGL}.mem_fraction_static=0.8", f"+{SGL}.random_seed=7",
                       f"{ARR}.rollout.cudagraph_capture_sizes=[1,8]")
    peers = [engine_kwargs(cfg, "/m", rank=r, base_gpu_id=0, fa3=False) for r in range(4)]
    assert [k["random_seed"] for k in peers] == [7, 7, 8, 8]  # one seed per TP block
    assert peers[0]["port"] != peers[2]["port"] and peers[0]["tp_size"] == 2
    assert peers[0]["attention_backend"] == "fa3" and peers[0]["mem_fraction_static"] == 0.8
    assert peers[0]["cuda_graph_bs_decode"] == [1, 8]


@pytest.mark.timeout(60)
def test_unknown_engine_kwargs_key_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="attention_bakend is not .*accepted: attention_backend, "):
        check_extra_keys({"attention_bakend": "triton"})
    with pytest.raises(ValueError, match="tp_size is set from actor_rollout_ref.rollout.tensor_model_parallel_size"):
        check_extra_keys({"tp_size": 2})
    check_extra_keys({k: 1 for k in ACCEPTED})
    # refused at start-up, before Ray starts
    with pytest.raises(ConfigError, match="engine_kwargs.sglang.attention_bakend is not"):
        _rollout_cfg(f"+{SGL}.attention_bakend=triton")


@pytest.mark.timeout(60)
def test_tensor_parallel_must_fit_a_node():
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=4, trainer.n_gpus_per_node=2.*"
                                          r"tensor_model_parallel_size=2"):
        compose_config(*SMALL, "trainer.device=cuda", f"{ARR}.rollout.name=sglang", "trainer.n_gpus_per_node=2",
                       f"{ARR}.rollout.tensor_model_parallel_size=4")
    assert _rollout_cfg(f"{ARR}.rollout.tensor_model_parallel_size=2").tensor_model_parallel_size == 2


@pytest.mark.timeout(30)
def test_scheduler_devices():
    # Ray: each peer sees its own GPU; the owner's schedulers see the block's, numbered from 0
    assert scheduler_devices(["2", "3"], 0) == ("2,3", 0)
    # torchrun without CUDA_VISIBLE_DEVICES, or a shared list: consecutive from the owner's device
    assert scheduler_devices(["", ""], 2) == (None, 2)
    assert scheduler_devices(["0,1,2,3", "0,1,2,3"], 2) == (None, 2)
    assert scheduler_devices(["5"], 0) == (None, 0)


@pytest.mark.timeout(30)
def test_fa3_is_looked_up_without_importing_sgl_kernel():
    assert fa3_installed() is False  # no sgl_kernel on the CPU machine


@pytest.mark.timeout(30)
def test_tensor_buckets_bound_bytes_and_keep_order():
    tensors = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 1, 100])]
    buckets = list(tensor_buckets(iter(tensors), max_bytes=80))
    assert [[name for name, _ in b] for b in buckets] == [["w0", "w1"], ["w2"], ["w3", "w4"], ["w5"]]
    assert list(tensor_buckets(iter([]), 10)) == []


@pytest.mark.timeout(30)
def test_sampling_mapping():
    spec = SamplingSpec(greedy=False, temperature=0.9, top_k=0, top_p=0.95, max_tokens=8, ignore_eos=False,
                        logprobs=True)
    sp = sampling_params(spec, {2})
    assert sp["top_k"] == -1 and sp["temperature"] == 0.9 and sp["stop_token_ids"] == [2]
    assert sp["max_new_tokens"] == 8 and sp["n"] == 1
    greedy = sampling_params(SamplingSpec(True, 1.0, -1, 1.0, 4, True, False), {2})
    assert greedy["temperature"] == 0.0 and greedy["stop_token_ids"] is None and greedy["ignore_eos"] is True


@pytest.mark.timeout(30)
def test_missing_cuda_compiler_names_the_toolchain_bundle(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # no bin/nvcc there
    with pytest.raises(RuntimeError, match=r"no nvcc .*gpu_bundle\.py --cuda-toolchain"):
        check_cuda_compiler()
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    assert check_cuda_compiler() == str(nvcc)


@pytest.mark.timeout(60)
def test_engine_environment_is_undone_after_the_engine_starts(monkeypatch):
    """What SGLang's engine sets process-wide (NCCL_CUMEM_ENABLE=0, ...) must not reach the actor's own NCCL
    communicator on the engine's owner only: the TP peers' communicators would differ (the first all-gather
    failed on 2 GPUs with TP 2)."""
    from rlpost.rollout.sglang import engine_environment

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    with engine_environment("1,0"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"  # what the spawned schedulers inherit
        os.environ["NCCL_CUMEM_ENABLE"] = "0"  # as sglang.Engine does
        os.environ["CUDA_MODULE_LOADING"] = "AUTO"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1" and "NCCL_CUMEM_ENABLE" not in os.environ
    assert os.environ["CUDA_MODULE_LOADING"] == "LAZY"
    with engine_environment(None):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"


class _OfflineEngineSurface:
    """What `SGLangAgentEngine` uses of `sglang.Engine` (not installable without CUDA): `loop` and
    `async_generate`, answering in SGLang's output shape ("output_ids"; "output_token_logprobs" entries are
    (log-prob, token id, text)); records each request."""

    def __init__(self) -> None:
        self.loop, self.requests = asyncio.new_event_loop(), []

    async def async_generate(self, input_ids, sampling_params, return_logprob):
        self.requests.append((input_ids, sampling_params, return_logprob))
        await asyncio.sleep(0)
        out = [len(input_ids) + i for i in range(sampling_params["max_new_tokens"])]
        return {"output_ids": out, "meta_info": {"output_token_logprobs": [(-0.25, t, None) for t in out]}}


@pytest.mark.timeout(30)
def test_agent_front_maps_requests_and_runs_on_the_engine_loop():
    from rlpost.rollout.async_engine import sampling_kwargs
    from rlpost.rollout.sglang import SGLangAgentEngine, SGLangRollout

    engine = _OfflineEngineSurface()
    rollout = object.__new__(SGLangRollout)  # the engine start is GPU-only; the front needs only `engine`
    rollout.engine = engine
    front = rollout.agent_engine({2})
    spec = SamplingSpec(greedy=False, temperature=0.9, top_k=0, top_p=0.95, max_tokens=3, ignore_eos=False,
                        logprobs=True)

    async def turns():
        assert asyncio.get_running_loop() is engine.loop  # SGLang answers from a task bound to its loop
        first = await asyncio.gather(front.generate([5, 6], sampling_kwargs(spec)),
                                     front.generate([7], sampling_kwargs(spec)))
        empty = await front.generate([1], {**sampling_kwargs(spec), "max_tokens": 0})
        plain = await front.generate([1], sampling_kwargs(SamplingSpec(True, 1.0, -1, 1.0, 2, True, False)))
        await front.close()
        return first, empty, plain

    try:
        first, empty, plain = rollout.run_coroutine(turns())
    finally:
        engine.loop.close()
    assert isinstance(front, SGLangAgentEngine)
    assert first == [([2, 3, 4], [-0.25] * 3), ([1, 2, 3], [-0.25] * 3)] and empty == ([], [])
    assert plain == ([1, 2], None)
    ids, params, logprob = engine.requests[0]
    assert ids == [5, 6] and logprob is True and params == sampling_params(spec, {2})
    assert engine.requests[-1][1]["temperature"] == 0.0 and engine.requests[-1][2] is False
