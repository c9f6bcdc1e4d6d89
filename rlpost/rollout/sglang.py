"""SGLang rollout (GPU only): one `sglang.Engine` per tensor-parallel block, owned by the block's first rank.

The ONLY module of rlpost that imports sglang; the import is guarded so that choosing this engine without
sglang or without a CUDA GPU fails with a message saying what is needed.

SGLang's offline Engine keeps its tokenizer manager in the calling (actor) process and runs one scheduler
process per TP rank (the model, KV cache and memory saver live there). The block's first rank starts the
engine with `tp_size` = the block size, its schedulers placed on the block's GPUs (`scheduler_devices`);
the other ranks of the block hold no engine: they take part in the weight gathers and receive the owner's
generations. Weights reach the schedulers by CUDA IPC handles (`update_weights_from_tensor`, in buckets),
no copy through the host. Sleep releases KV cache and CUDA graphs through the memory saver, and the
weights too when an actor will re-sync them (`needs_sync` until then).

Log-probs: SGLang returns the log-prob of each sampled token after temperature scaling (the actor computes
the same quantity from `logits / temperature`).
"""

from __future__ import annotations

import collections

import logging
import os
import time
from contextlib import contextmanager
from collections.abc import Coroutine
from typing import Any, Iterable, Iterator, TypeVar

import torch
import torch.distributed as dist

from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout import ROLLOUT_REGISTRY
from rlpost.rollout import sglang_args
from rlpost.rollout.async_engine import AgentEngine, Completion, spec_of
from rlpost.rollout.base import BaseRollout, resolve_sampling
from rlpost.rollout.sglang_args import check_cuda_compiler, engine_kwargs, fa3_installed, scheduler_devices
from rlpost.rollout.utils import assemble_output, eos_id_set, prompt_token_lists, tensor_buckets
from rlpost.utils.distributed import consecutive_groups, gather_in_group

T = TypeVar("T")

logger = logging.getLogger(__name__)

_BUCKET_BYTES = 512 * 2**20  # tensors per `update_weights_from_tensor` call: bounds the extra memory in flight
_INSTALL = ("install the SGLang bundle (docs/gpu.md: python scripts/gpu_bundle.py --sglang, then "
            "scripts/gpu_install.sh PARTS /tmp/rlpost_sglang and its PYTHONPATH line) or use rollout.name=vllm")


def _import_sglang(device: str) -> Any:
    """Import sglang (and patch torch's CUDA-tensor pickling the way its schedulers unpickle) or say what is
    missing."""
    if device != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"actor_rollout_ref.rollout.name=sglang needs a CUDA GPU (device is {device!r}); use "
            "rollout.name=vllm or hf on CPU"
        )
    try:
        import sglang
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    except ImportError as err:
        raise RuntimeError(f"actor_rollout_ref.rollout.name=sglang needs the sglang package ({err}): {_INSTALL}") \
            from err
    check_cuda_compiler()
    # CUDA tensors are then pickled with the device's UUID, not its index: the schedulers number the
    # GPUs differently from this process (see `scheduler_devices`).
    monkey_patch_torch_reductions()
    return sglang


@contextmanager
def engine_environment(visible_devices: str | None) -> Iterator[None]:
    """The environment SGLang's engine starts in: CUDA_VISIBLE_DEVICES = `visible_devices` (None keeps this
    process's) for the scheduler processes it spawns, and afterwards this process's environment exactly as
    before. `sglang.Engine` sets process-wide NCCL variables (NCCL_CUMEM_ENABLE=0, NCCL_NVLS_ENABLE, ...);
    left in place they would apply to the actor's own NCCL communicator, created lazily at the first weight
    gather, on the engine's owner only: its TP peers' communicators then differ and the first all-gather fails
    ("unhandled cuda error ... invalid argument"). The spawned schedulers keep what they inherited."""
    saved = dict(os.environ)
    if visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@ROLLOUT_REGISTRY.register("sglang")
class SGLangRollout(BaseRollout):
    """SGLang engine of this rank's TP block (see the module docstring); TP peers must make every call
    together, with the same prompts (the worker gathers the block's rows first)."""

    agent_tp_mode = "owner"  # multi-turn: the owner's engine serves the block's agent loops, the peers wait

    def __init__(self, config: Any, model_path: str, tokenizer: Any, device: str,
                 module: torch.nn.Module | None = None) -> None:
        sglang = _import_sglang(device)
        self.config, self.tokenizer = config, tokenizer
        self.free_cache_engine = config.free_cache_engine
        # With an actor in this process the weights are re-synced after every sleep: drop them then.
        self.release_weights = module is not None
        tp = config.tensor_model_parallel_size
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.group, tp_rank = consecutive_groups(tp) if tp > 1 else (None, 0)
        self.owner_rank = rank - tp_rank
        visible = gather_in_group(os.environ.get("CUDA_VISIBLE_DEVICES", ""), self.group)
        self._asleep: tuple[str, ...] = ()
        self.engine = None
        if tp_rank == 0:
            children, base_gpu_id = scheduler_devices([str(v) for v in visible], torch.cuda.current_device())
            kwargs = engine_kwargs(config, model_path, rank, base_gpu_id, fa3_installed())
            start = time.perf_counter()
            with engine_environment(children):
                self.engine = sglang.Engine(**kwargs)
            logger.info("SGLang engine started in %.1f s (tp %d, attention %s)", time.perf_counter() - start, tp,
                        kwargs.get("attention_backend", "default"))
        if self.group is not None:
            dist.barrier(group=self.group)

    @property
    def sleeping(self) -> bool:
        """True while any engine memory (weights, KV cache, CUDA graphs) is released."""
        return bool(self._asleep)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """See `BaseRollout.generate_sequences`; the owner generates, its TP peers receive the result."""
        spec = resolve_sampling(self.config, prompts.meta_info)
        result: list[Any] = [None]
        if self.engine is not None:
            stop_ids = eos_id_set(prompts.meta_info.get(keys.META_EOS_TOKEN_ID))
            outs = self.engine.generate(input_ids=prompt_token_lists(prompts),
                                        sampling_params=sglang_args.sampling_params(spec, stop_ids),
                                        return_logprob=spec.logprobs)
            token_ids = [list(o["output_ids"]) for o in outs]
            log_probs = None
            if spec.logprobs:  # entries are (logprob, token_id, text)
                log_probs = [[float(e[0]) for e in o["meta_info"]["output_token_logprobs"]] for o in outs]
            result = [(token_ids, log_probs)]
        if self.group is not None:
            dist.broadcast_object_list(result, src=self.owner_rank, group=self.group)
        token_ids, log_probs = result[0]
        return assemble_output(prompts, token_ids, spec.max_tokens, log_probs)

    def agent_engine(self, stop_ids: set[int]) -> SGLangAgentEngine:
        """The agent loops' front: each request goes to SGLang's own scheduler as it comes (see
        `SGLangAgentEngine`); with TP > 1 only the block's owner has one (it runs the block's agent loops)."""
        if self.engine is None:
            raise RuntimeError("this rank is a TP peer without an SGLang engine: the block's first rank runs the "
                               "agent loops (AgentRollout.generate_in_block)")
        return SGLangAgentEngine(self.engine, stop_ids)

    def run_coroutine(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """On the engine's own event loop: SGLang answers requests from a task bound to that loop."""
        return self.engine.loop.run_until_complete(coroutine)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send the tensors to the engine in buckets of at most `_BUCKET_BYTES`, then flush the prefix cache
        (cached KV was computed with the old weights). Every TP peer consumes the whole iterator (its
        gathers are collectives); only the owner sends. Wakes the weights, not the KV cache."""
        start = time.perf_counter()
        self._resume(("weights",))
        if self.engine is None:  # a TP peer: drive the iterator so its FSDP all-gathers run; nothing to send
            collections.deque(named_tensors, maxlen=0)
        else:
            for bucket in tensor_buckets(named_tensors, _BUCKET_BYTES):
                self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)
            self.engine.flush_cache()
        self.needs_sync = False
        self.last_sync_s = time.perf_counter() - start
        logger.info("SGLang weights synced in %.3f s", self.last_sync_s)

    def sleep(self) -> None:
        """Release the KV cache and CUDA graphs (and the weights, when an actor re-syncs them: `needs_sync`)
        while the actor trains; without free_cache_engine only the prefix cache is dropped. Every TP peer
        keeps the same state, so that all of them take part in the next sync."""
        if self._asleep:
            return
        if not self.free_cache_engine:
            if self.engine is not None:
                self.engine.flush_cache()
            return
        tags = ("kv_cache", "cuda_graph") + (("weights",) if self.release_weights else ())
        if self.engine is not None:
            self.engine.release_memory_occupation(tags=list(tags))  # flushes the prefix cache too
        self._asleep = tags
        self.needs_sync = self.release_weights

    def wake_up(self) -> None:
        """Undo `sleep` (what `update_weights` has not woken already); call before the next generation.

        Raises:
            RuntimeError: the weights were released and no `update_weights` has run since.
        """
        if "weights" in self._asleep:
            raise RuntimeError("SGLang released its weights in sleep: call update_weights before wake_up")
        self._resume(self._asleep)

    def _resume(self, tags: tuple[str, ...]) -> None:
        """Re-occupy the released memory of `tags` (those of them that are asleep)."""
        tags = tuple(t for t in tags if t in self._asleep)
        if tags and self.engine is not None:
            self.engine.resume_memory_occupation(tags=list(tags))
        self._asleep = tuple(t for t in self._asleep if t not in tags)

    def shutdown(self) -> None:
        """Stop the engine's scheduler and detokenizer processes."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class SGLangAgentEngine(AgentEngine):
    """Continuous batching by SGLang's scheduler: every trajectory's request is sent (`Engine.async_generate`,
    token ids in and out) the moment the trajectory asks, and joins the requests already running; must run on
    the engine's event loop (`SGLangRollout.run_coroutine`)."""

    def __init__(self, engine: Any, stop_ids: set[int]) -> None:
        self.engine, self.stop_ids = engine, stop_ids

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Completion:
        spec = spec_of(sampling_params)
        if spec.max_tokens <= 0:
            return [], ([] if spec.logprobs else None)
        out = await self.engine.async_generate(input_ids=list(prompt_ids),
                                               sampling_params=sglang_args.sampling_params(spec, self.stop_ids),
                                               return_logprob=spec.logprobs)
        log_probs = [float(e[0]) for e in out["meta_info"]["output_token_logprobs"]] if spec.logprobs else None
        return list(out["output_ids"]), log_probs
