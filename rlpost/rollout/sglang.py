"""SGLang rollout (GPU only): `sglang.Engine` started by the worker, weights synced by tensor handles.

The ONLY module of rlpost that imports sglang; the import is guarded so that choosing this engine
without sglang or without a CUDA GPU fails with a message saying what is needed. Not exercised on the
CPU CI; GPU tests are marked `gpu`.

Note: `sglang.Engine` runs its scheduler in a child process; `update_weights_from_tensor` hands the
tensors over by CUDA IPC handles (no copy through the host), one bucket at a time.
"""

from __future__ import annotations

import logging
import os
import time
from itertools import islice
from typing import Any, Iterable

import torch

from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout import ROLLOUT_REGISTRY
from rlpost.rollout.base import BaseRollout, SamplingSpec, resolve_sampling
from rlpost.rollout.utils import assemble_output, eos_id_set, prompt_token_lists

logger = logging.getLogger(__name__)

_BUCKET_TENSORS = 64  # tensors per update_weights_from_tensor call: bounds the extra memory in flight


def _import_sglang(device: str) -> Any:
    """Import sglang or explain what is missing."""
    if device != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            "actor_rollout_ref.rollout.name=sglang needs a CUDA GPU (device is "
            f"{device!r}); use rollout.name=vllm or hf on CPU"
        )
    try:
        import sglang
    except ImportError as err:
        raise RuntimeError(
            "actor_rollout_ref.rollout.name=sglang needs the sglang package "
            "(pip install 'rlpost[sglang]', sglang>=0.5.12 with a matching torch)"
        ) from err
    return sglang


def engine_kwargs(config: Any, model_path: str) -> dict[str, Any]:
    """rollout config -> `sglang.Engine(...)` arguments; gpu_memory_utilization -> mem_fraction_static
    unless engine_kwargs.sglang.mem_fraction_static is given (null entries of engine_kwargs.sglang are
    dropped, the others passed last and win); `max_model_len: null` means prompt + response length."""
    extra = {k: v for k, v in dict(config.engine_kwargs.sglang).items() if v is not None}
    rank = int(os.environ.get("RANK", "0"))
    context_length = config.max_model_len
    if context_length is None:
        context_length = int(config.prompt_length) + int(config.response_length)
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "dtype": str(config.dtype),
        "mem_fraction_static": float(config.gpu_memory_utilization),
        "context_length": int(context_length),
        "load_format": "dummy" if str(config.load_format).startswith("dummy") else "auto",
        "tp_size": 1,
        "base_gpu_id": int(os.environ.get("LOCAL_RANK", "0")),
        "random_seed": rank,
        "enable_memory_saver": bool(config.free_cache_engine),
        "skip_tokenizer_init": True,
        "log_level": "error",
    }
    kwargs.update(extra)
    return kwargs


def sampling_params(spec: SamplingSpec, stop_ids: set[int]) -> dict[str, Any]:
    """SGLang sampling dict; SGLang's "off" value for top_k is -1."""
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


@ROLLOUT_REGISTRY.register("sglang")
class SGLangRollout(BaseRollout):
    """`sglang.Engine` per worker process (TP 1)."""

    def __init__(self, config: Any, model_path: str, tokenizer: Any, device: str, module: Any = None) -> None:
        sglang = _import_sglang(device)
        self.config, self.tokenizer = config, tokenizer
        self.free_cache_engine = bool(config.free_cache_engine)
        start = time.perf_counter()
        self.engine = sglang.Engine(**engine_kwargs(config, model_path))
        logger.info("SGLang engine started in %.1f s", time.perf_counter() - start)
        self.sleeping = False

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """See `BaseRollout.generate_sequences`."""
        spec = resolve_sampling(self.config, prompts.meta_info)
        stop_ids = eos_id_set(prompts.meta_info.get(keys.META_EOS_TOKEN_ID))
        outs = self.engine.generate(
            input_ids=prompt_token_lists(prompts),
            sampling_params=sampling_params(spec, stop_ids),
            return_logprob=spec.logprobs,
        )
        token_ids = [list(o["output_ids"]) for o in outs]
        log_probs = None
        if spec.logprobs:  # entries are (logprob, token_id, text)
            log_probs = [[float(e[0]) for e in o["meta_info"]["output_token_logprobs"]] for o in outs]
        return assemble_output(prompts, token_ids, spec.max_tokens, log_probs)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send buckets of `_BUCKET_TENSORS` tensors to `update_weights_from_tensor`, then flush the cache."""
        start = time.perf_counter()
        self.wake_up()  # the memory saver released the weights too
        it = iter(named_tensors)
        while bucket := list(islice(it, _BUCKET_TENSORS)):
            self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)
        self.engine.flush_cache()
        self.last_sync_s = time.perf_counter() - start
        logger.info("SGLang weights synced in %.3f s", self.last_sync_s)

    def sleep(self) -> None:
        """Release KV cache and weights memory (memory saver) while the actor trains."""
        if self.free_cache_engine and not self.sleeping:
            self.engine.flush_cache()
            self.engine.release_memory_occupation()
            self.sleeping = True

    def wake_up(self) -> None:
        """Re-occupy the memory released by `sleep`."""
        if self.sleeping:
            self.engine.resume_memory_occupation()
            self.sleeping = False
