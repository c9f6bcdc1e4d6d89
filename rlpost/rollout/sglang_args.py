"""SGLang engine arguments from the rollout config: pure functions, importable without sglang or a GPU.

`rlpost.rollout.sglang` builds the engine from `engine_kwargs`; start-up validation (before Ray) calls
`check_extra_keys` so that a misspelt `engine_kwargs.sglang` key fails at once, not minutes later in a worker.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
from typing import Any

from rlpost.rollout.base import SamplingSpec
from rlpost.rollout.utils import engine_seed, load_format_name, max_model_len

KEY = "actor_rollout_ref.rollout.engine_kwargs.sglang"

# `sglang.Engine` (ServerArgs) arguments a run may set through engine_kwargs.sglang, passed through unchanged.
ACCEPTED = (
    "attention_backend", "chunked_prefill_size", "cuda_graph_bs_decode", "cuda_graph_max_bs_decode",
    "decode_attention_backend", "disable_cuda_graph", "disable_radix_cache", "enable_deterministic_inference",
    "enable_torch_compile", "kv_cache_dtype", "log_level", "max_prefill_tokens", "max_running_requests",
    "max_total_tokens", "mem_fraction_static", "page_size", "port", "prefill_attention_backend", "random_seed",
    "sampling_backend", "schedule_conservativeness", "schedule_policy", "torch_compile_max_bs",
    "triton_attention_num_kv_splits",
)

# Engine arguments that follow from the rollout config: set them there, not in engine_kwargs.sglang.
FROM_ROLLOUT = {
    "model_path": "actor_rollout_ref.model.path", "dtype": "actor_rollout_ref.rollout.dtype",
    "tp_size": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "context_length": "actor_rollout_ref.rollout.max_model_len",
    "load_format": "actor_rollout_ref.rollout.load_format",
    "enable_memory_saver": "actor_rollout_ref.rollout.free_cache_engine",
}


def check_extra_keys(extra: dict[str, Any]) -> None:
    """Refuse `engine_kwargs.sglang` keys rlpost does not pass to the engine.

    Raises:
        ValueError: names the key and either the rollout key that sets it or the accepted keys.
    """
    for key in extra:
        if key in FROM_ROLLOUT:
            raise ValueError(f"{KEY}.{key} is set from {FROM_ROLLOUT[key]}: set that key instead")
        if key not in ACCEPTED:
            raise ValueError(f"{KEY}.{key} is not an SGLang engine argument rlpost passes on; accepted: "
                             f"{', '.join(ACCEPTED)}")


def fa3_installed() -> bool:
    """True when sgl_kernel's FA3 library is present (the GPU bundle strips it; see scripts/gpu_bundle.py).

    Looks for the file without importing sgl_kernel, whose import loads CUDA libraries."""
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(glob.glob(os.path.join(d, "flash_ops*.so")) for d in spec.submodule_search_locations)


def check_cuda_compiler() -> str:
    """The nvcc SGLang's run-time kernels (`sglang.jit_kernel`) are compiled with: `$CUDA_HOME/bin/nvcc`, else
    the one on PATH. Checked before the engine starts: without it the first forward fails inside a scheduler.

    Raises:
        RuntimeError: no nvcc; says how to carry one in.
    """
    home = os.environ.get("CUDA_HOME")
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.access(nvcc, os.X_OK):
        raise RuntimeError(
            f"actor_rollout_ref.rollout.name=sglang compiles some CUDA kernels at run time and finds no nvcc "
            f"(CUDA_HOME={home!r}): install the CUDA compiler bundle (docs/gpu.md: scripts/gpu_bundle.py "
            "--cuda-toolchain, scripts/gpu_install.sh PARTS /tmp/rlpost_cuda) and export the CUDA_HOME / PATH "
            "it prints")
    return nvcc


def scheduler_devices(visible: list[str], local_device: int) -> tuple[str | None, int]:
    """Where the engine's scheduler processes (one per TP rank) run, from the TP peers' CUDA_VISIBLE_DEVICES.

    SGLang starts one scheduler process per TP rank on devices `base_gpu_id`, `base_gpu_id + 1`, ... as its
    owner (the block's first rank) numbers them. Under Ray each peer sees only its own GPU, so the owner's
    children must see the block's GPUs joined in rank order (numbered from 0); when the peers share one
    list (or none is set) the block's devices are consecutive from the owner's own.

    Args:
        visible: each TP peer's CUDA_VISIBLE_DEVICES ("" when unset), in rank order.
        local_device: the owner's current CUDA device index.

    Returns:
        (CUDA_VISIBLE_DEVICES for the schedulers or None to keep the owner's, base_gpu_id).
    """
    if len(set(visible)) == 1:
        return None, local_device
    return ",".join(visible), 0


# SGLang's scheduler clips a request's new tokens to context_length - input_length - 2 (its longest request is
# context_length - 1 tokens, and one more is kept free): a context of exactly prompt + response would cut
# the last two tokens of the longest responses.
SCHEDULER_RESERVE = 2


def context_length(config: Any) -> int:
    """SGLang's `context_length`: the rollout's `max_model_len` (null = prompt + response) raised to prompt +
    response + `SCHEDULER_RESERVE`, so that every response can reach `response_length` tokens."""
    needed = config.prompt_length + config.response_length + SCHEDULER_RESERVE
    return max(max_model_len(config), needed)


def engine_kwargs(config: Any, model_path: str, rank: int, base_gpu_id: int, fa3: bool) -> dict[str, Any]:
    """Rollout config -> `sglang.Engine(...)` arguments (validated `engine_kwargs.sglang` entries win).

    The context length is `context_length(config)`; `gpu_memory_utilization` becomes
    `mem_fraction_static`; the seed is `random_seed` (default 0) plus the replica index, so TP peers
    share one and replicas differ. Defaults rlpost picks: `attention_backend` triton where FA3 is not
    installed (`fa3`), `sampling_backend` pytorch (FlashInfer's sampler compiles kernels at start-up).
    """
    extra = {k: v for k, v in dict(config.engine_kwargs.sglang).items() if v is not None}
    check_extra_keys(extra)
    tp = config.tensor_model_parallel_size
    chunked = config.max_num_batched_tokens if config.enable_chunked_prefill else -1
    replica = rank // tp
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "dtype": str(config.dtype),
        "load_format": load_format_name(config.load_format),
        "context_length": context_length(config),
        "mem_fraction_static": config.gpu_memory_utilization,
        "tp_size": tp,
        "base_gpu_id": base_gpu_id,
        "gpu_id_step": 1,
        "random_seed": engine_seed(config, extra.pop("random_seed", None)) + replica,
        # engines of one node must not pick the same ports (SGLang probes from `port` upwards)
        "port": 30000 + 1000 * replica,
        "enable_memory_saver": config.free_cache_engine,
        "skip_tokenizer_init": True,
        "disable_cuda_graph": config.enforce_eager,
        "max_running_requests": config.max_num_seqs,
        "chunked_prefill_size": chunked,
        "disable_radix_cache": not config.enable_prefix_caching,
        "log_level": "error",
        "sampling_backend": "pytorch",
    }
    if not fa3:
        kwargs["attention_backend"] = "triton"
    if config.cudagraph_capture_sizes is not None:
        kwargs["cuda_graph_bs_decode"] = [int(n) for n in config.cudagraph_capture_sizes]
    kwargs.update(extra)
    return kwargs


def sampling_params(spec: SamplingSpec, stop_ids: set[int]) -> dict[str, Any]:
    """One SGLang sampling dict for all rows (one sample per row); SGLang's "off" value for top_k is -1."""
    params: dict[str, Any] = {
        "max_new_tokens": spec.max_tokens,
        "ignore_eos": spec.ignore_eos,
        "stop_token_ids": None if spec.ignore_eos else sorted(stop_ids),
        "n": 1,
    }
    if spec.greedy:
        params.update(temperature=0.0, top_k=1, top_p=1.0)
    else:
        params.update(temperature=spec.temperature, top_k=spec.top_k if spec.top_k > 0 else -1, top_p=spec.top_p)
    return params
