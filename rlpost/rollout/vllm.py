"""vLLM rollout: an in-process `vllm.LLM` engine inside the actor/rollout worker (hybrid engine).

The rollout's only module that imports vllm (the judge's server, rlpost/workers/judge_server.py, has its own).
`VLLM_ENABLE_V1_MULTIPROCESSING=0` is set (setdefault) before the import: otherwise vLLM spawns its engine core
as a child process and the actor's weights could not be handed over in place. On CPU, `VLLM_CPU_KVCACHE_SPACE`
(GiB) sizes the KV cache; `gpu_memory_utilization` only matters on GPU.

Log-probs: the engine runs with `logprobs_mode="processed_logprobs"`, so `rollout_log_probs` are the
log-probs of the sampled token after temperature scaling (and top-k/top-p, when enabled) - the same
quantity the actor computes from `logits / temperature` when top-k/top-p are off.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import fields, replace
from typing import Any, Callable, Iterable, Iterator

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402

from rlpost import keys  # noqa: E402
from rlpost.protocol import DataProto  # noqa: E402
from rlpost.rollout import ROLLOUT_REGISTRY  # noqa: E402
from rlpost.rollout.async_engine import SteppedEngine  # noqa: E402
from rlpost.rollout.base import BaseRollout, SamplingSpec, resolve_sampling  # noqa: E402
from rlpost.rollout.utils import (assemble_output, engine_seed, eos_id_set, load_format_name, max_model_len,  # noqa: E402
                                  prompt_token_lists, row_caps)
from rlpost.utils.profiler import set_unbacked_bytes  # noqa: E402
from rlpost.utils.vl_processor import inspect_vllm_models_in_process  # noqa: E402

logger = logging.getLogger(__name__)

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def _is_vision_language(model_path: str) -> bool:
    """True when the model folder's config has a vision tower (Qwen2-VL family)."""
    from transformers import AutoConfig

    from rlpost.utils.model import is_vision_language

    try:
        return is_vision_language(AutoConfig.from_pretrained(model_path))
    except (OSError, ValueError):  # a config transformers cannot read: vLLM reports it
        return False


def _rank_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _parallel_kwargs(config: Any, device: str) -> dict[str, Any]:
    """TP layout. Every rank runs its own in-process engine. With TP>1 each block of `tp` consecutive ranks
    holds one engine, one shard per rank (`external_launcher`; on CPU its collectives go over gloo); the
    blocks generate independently (vLLM's "external data parallel": no lock-step between them). The worker
    hands the peers of a block the same prompts (`ActorRolloutRefWorker._generate_with_tp_peers`), and in
    multi-turn rollouts the same engine calls (`rlpost.rollout.lockstep`)."""
    tp = config.tensor_model_parallel_size
    _, world = _rank_world()
    if world % tp:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the world size {world}"
        )
    out: dict[str, Any] = {"tensor_parallel_size": tp}
    if tp > 1:
        out["distributed_executor_backend"] = "external_launcher"
        # Ray gives each worker only its own GPU (CUDA_VISIBLE_DEVICES): vLLM's custom all-reduce needs
        # peer access set up between visible devices, so TP traffic goes through NCCL instead.
        out["disable_custom_all_reduce"] = True
    return out


SHM_TAG_ENV = "RLPOST_VLLM_SHM_TAG"


def tag_cpu_shm_names(tag: str) -> bool:
    """Give this process's vLLM CPU shared-memory segments (the TP/PP collectives of an `external_launcher`
    engine) names of their own: `rlpost<tag>-tp:0-[0-1]-cpushm_<rank>` instead of `-tp:0-[0-1]-cpushm_<rank>`.

    vLLM names them from the engine's init method, which `external_launcher` fixes to `env://`, so every such
    engine on a host asks for the same /dev/shm names: a second one at the same time (two jobs, two test
    processes) fails with `create shm in SHMManager failed. errno: 17` (EEXIST), and so does the next one after a
    job whose ranks were killed (Ray ends its workers without unlinking them). `tag` must be the same on every
    rank of the TP block (their names are compared, and differing names fall back to torch.distributed); the
    job's MASTER_PORT is (one port per live job on a host). Returns False where vLLM has no such segments."""
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return False
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if shm is None or not hasattr(shm, "make_group_name"):
        return False
    os.environ[SHM_TAG_ENV] = tag
    if not getattr(shm, "_rlpost_tagged", False):
        untagged = shm.make_group_name

        def make_group_name(communicator: Any) -> str:
            # shm_open takes one leading slash and none after it: the init method's "//" goes
            return f"rlpost{os.environ.get(SHM_TAG_ENV, '')}{untagged(communicator).lstrip('/')}"

        shm.make_group_name = staticmethod(make_group_name)
        shm._rlpost_tagged = True
    return True


def _lora_kwargs(lora_rank: int) -> dict[str, Any]:
    """One LoRA adapter slot of at least `lora_rank` (the actor's adapter, replaced after each update)."""
    if lora_rank <= 0:
        return {}
    if lora_rank > _LORA_RANKS[-1]:
        raise ValueError(f"actor_rollout_ref.model.lora_rank={lora_rank}: vLLM serves adapters up to rank "
                         f"{_LORA_RANKS[-1]}; use a smaller rank or actor_rollout_ref.model.lora.merge=true")
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": min(r for r in _LORA_RANKS if r >= lora_rank)}


def engine_kwargs(config: Any, model_path: str, device: str, lora_rank: int = 0) -> dict[str, Any]:
    """Translate the rollout config into `vllm.LLM(...)` keyword arguments (pure; tested directly).

    `max_model_len: null` means prompt_length + response_length; `engine_kwargs.vllm` entries (null ones
    dropped) are passed last and win; the base of the per-replica seed is `rollout.seed`, else its `seed`
    (`engine_seed`). `lora_rank` > 0 reserves
    an adapter slot (the engine serves the actor's LoRA adapter, `VLLMRollout.load_adapter`).
    """
    tp = config.tensor_model_parallel_size
    rank, _ = _rank_world()
    extra = {k: v for k, v in dict(config.engine_kwargs.vllm).items() if v is not None}
    kwargs: dict[str, Any] = {
        "model": model_path,
        "dtype": str(config.dtype),
        "load_format": load_format_name(config.load_format),
        "max_model_len": max_model_len(config),
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "enforce_eager": config.enforce_eager,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enable_prefix_caching": config.enable_prefix_caching,
        "disable_log_stats": config.disable_log_stats,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        # one seed per data-parallel replica: TP peers must sample identically, replicas must not
        "seed": engine_seed(config, extra.pop("seed", None)) + rank // tp,
        "logprobs_mode": "processed_logprobs",
        "enable_sleep_mode": device == "cuda" and config.free_cache_engine,
        **_parallel_kwargs(config, device),
        **_lora_kwargs(lora_rank),
    }
    if config.cudagraph_capture_sizes is not None:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": [int(n) for n in config.cudagraph_capture_sizes]}
    swap_space = config.engine_kwargs.swap_space
    if swap_space is not None:
        if "swap_space" not in {f.name for f in fields(vllm.EngineArgs)}:
            raise NotImplementedError(
                f"not supported yet: actor_rollout_ref.rollout.engine_kwargs.swap_space={swap_space} "
                f"(vLLM {vllm.__version__} has no swap_space; set it to null)"
            )
        kwargs["swap_space"] = swap_space
    kwargs.update(extra)
    return kwargs


_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def engine_env(config: Any, device: str) -> dict[str, str]:
    """Environment variables the engine must see before it starts (pure; tested directly): `rollout.model_runner`
    v1 / v2 sets `VLLM_USE_V2_MODEL_RUNNER` (vLLM has no engine argument for it); null sets nothing.

    Raises:
        ValueError: a model runner named on CPU (vLLM's CPU backend has its own runner).
    """
    runner = config.model_runner
    if runner is None:
        return {}
    if device != "cuda":
        raise ValueError(f"actor_rollout_ref.rollout.model_runner={runner}: vLLM's CPU backend has its own model "
                         "runner; set it to null (v1 / v2 choose between vLLM's GPU runners)")
    return {_RUNNER_ENV: "1" if runner == "v2" else "0"}


def apply_engine_env(env: dict[str, str]) -> None:
    """Set `env` (from `engine_env`) in this process before the engine starts. vLLM caches its environment once an
    engine has started in the process, so a later engine that asks for another runner is refused by name."""
    os.environ.update(env)
    if _RUNNER_ENV in env:
        from vllm import envs

        wanted = env[_RUNNER_ENV] == "1"
        if envs.VLLM_USE_V2_MODEL_RUNNER != wanted:  # None: cached before it was set
            raise RuntimeError(
                f"actor_rollout_ref.rollout.model_runner={'v2' if wanted else 'v1'}: an engine started earlier in "
                f"this process fixed vLLM's {_RUNNER_ENV}; start this engine in a fresh process")


def sampling_params(spec: SamplingSpec, stop_ids: set[int]) -> SamplingParams:
    """One `SamplingParams` for all rows (each row is one sample: n=1)."""
    common = dict(
        n=1,
        max_tokens=spec.max_tokens,
        ignore_eos=spec.ignore_eos,
        stop_token_ids=None if spec.ignore_eos else sorted(stop_ids),
        logprobs=0 if spec.logprobs else None,
        detokenize=False,
    )
    if spec.greedy:
        return SamplingParams(temperature=0.0, **common)
    return SamplingParams(
        temperature=spec.temperature, top_k=max(spec.top_k, 0), top_p=spec.top_p, **common
    )


def sleeping_pool_bytes(awake: tuple[str, ...] = ()) -> int:
    """Bytes of vLLM's sleep-mode pool outside the woken tags `awake` ("weights", "kv_cache"): what a sleep
    unmapped (every tag) while the caching allocator still counts it as allocated."""
    from vllm.device_allocator.cumem import CuMemAllocator

    pool = CuMemAllocator.get_instance().pointer_to_data.values()
    # newer vLLM marks each allocation (and wakes tags beyond the ones asked for); 0.24 has only the two tags
    return sum(data.handle[1] for data in pool if getattr(data, "is_asleep", data.tag not in awake))


def _sampled_log_probs(completion: Any) -> list[float]:
    """Log-prob of each sampled token (vLLM with `logprobs=0` returns just the sampled one per position)."""
    return [step[tok].logprob for tok, step in zip(completion.token_ids, completion.logprobs)]


class VLLMStepEngine(SteppedEngine):
    """Continuous batching on the in-process engine: each agent request goes straight into
    `LLMEngine.add_request` and `LLMEngine.step()` advances every running request by one token, so requests
    of many trajectories share each forward pass as they arrive.

    Args:
        llm: the rollout's `vllm.LLM`; nothing else may drive its engine while agent loops run.
        stop_ids: EOS ids that end a completion (kept in its ids).
    """

    def __init__(self, llm: LLM, stop_ids: set[int], lora_request: Any = None) -> None:
        super().__init__()
        self.engine, self.stop_ids, self.lora_request = llm.llm_engine, stop_ids, lora_request

    def _add(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> None:
        params = sampling_params(spec, self.stop_ids)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it finishes
        self.engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params, lora_request=self.lora_request)

    def _step(self) -> list[tuple[str, list[int], list[float] | None]]:
        finished = []
        for out in self.engine.step():
            if out.finished:
                completion = out.outputs[0]
                log_probs = _sampled_log_probs(completion) if completion.logprobs is not None else None
                finished.append((out.request_id, list(completion.token_ids), log_probs))
        return finished

    def _abort(self, request_ids: list[str]) -> None:
        self.engine.abort_request(request_ids)


def _refresh_cpu_packed(model: torch.nn.Module) -> int:
    """Re-pack CPU GEMM weights of layers that keep their weight (embeddings, a tied `lm_head`).

    vLLM's CPU backend computes linear layers from a packed copy made after loading. `reload_weights`
    re-packs every layer it loads, but a tied `lm_head` receives no weight of its own (its tensor is the
    embedding's), so its packed copy would keep the OLD weights. Returns the number of layers re-packed.
    """
    count = 0
    for layer in model.modules():
        weight = getattr(layer, "weight", None)
        method = getattr(layer, "quant_method", None)
        if hasattr(layer, "cpu_linear") and weight is not None and weight.numel() and method is not None:
            method.process_weights_after_loading(layer)
            count += 1
    return count


def restore_image_normalization(runner: Any) -> int:
    """Set the image-normalisation buffers of a vision-language engine model back to the processor's values.

    vLLM normalises pixels on the device with per-channel `weight` / `bias` buffers computed from the processor
    config (`FusedMMInputNorm`); they are not checkpoint weights, so under `load_format=dummy` they stay random
    and no weight sync writes them: every image the engine sees would be distorted (the policy samples from
    other pictures than the actor trains on). Returns the number of modules set (0 on a vLLM without them)."""
    try:
        from vllm.model_executor.layers.fusion.mm_input_norm import FusedMMInputNorm, _load_norm_params
    except ImportError:  # an older vLLM normalises on the host
        return 0
    norms = [m for m in runner.model.modules() if isinstance(m, FusedMMInputNorm)]
    if not norms:
        return 0
    params = _load_norm_params(runner.model_config)  # as FusedMMInputNorm's own __init__ computes them
    mean, std = torch.tensor(params.image_mean), torch.tensor(params.image_std)
    with torch.no_grad():
        for module in norms:
            module.weight.copy_((params.rescale_factor / std).to(module.weight))
            module.bias.copy_((-mean / std).to(module.bias))
    return len(norms)


MEMORY_ADAPTER_PREFIX = "rlpost-memory://"  # the `lora_path` of an adapter handed over in memory (no such folder)


def _peft_config_dict(peft_config: Any) -> dict[str, Any]:
    """The `adapter_config.json` content of a `peft.LoraConfig` (sets as lists, enums as their strings)."""
    import json

    return json.loads(json.dumps(peft_config.to_dict(), default=sorted))


def _memory_adapters(worker: Any) -> dict[int, tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """adapter id -> (tensors, config) staged on `worker`'s LoRA manager (`_install_memory_adapter_loader`)."""
    return getattr(worker, "model_runner", worker).lora_manager.rlpost_memory_adapters


def _install_memory_adapter_loader(worker: Any) -> bool:
    """Runs in the engine's worker: wraps its LoRA manager's `_load_adapter` (vLLM 0.24 and 0.32 read a PEFT
    folder there) so that an adapter id staged in `rlpost_memory_adapters` is built from those tensors instead
    (`_adapter_from_memory`); every other request loads as before. Returns False when the worker has no such
    loader (the rollout falls back to folders). Idempotent."""
    manager = getattr(getattr(worker, "model_runner", worker), "lora_manager", None)
    if manager is None or not callable(getattr(manager, "_load_adapter", None)):
        return False
    if getattr(manager, "rlpost_memory_adapters", None) is None:
        manager.rlpost_memory_adapters = {}
        from_folder = manager._load_adapter

        def load(lora_request: Any) -> Any:
            # taken out: vLLM keeps the tensors and scales lora_B in place (`LoRALayerWeights.optimize`)
            staged = manager.rlpost_memory_adapters.pop(lora_request.lora_int_id, None)
            if staged is not None:
                return _adapter_from_memory(manager, lora_request, *staged)
            if str(lora_request.lora_path).startswith(MEMORY_ADAPTER_PREFIX):
                raise RuntimeError(f"LoRA adapter {lora_request.lora_name} was handed over in memory and already "
                                   "loaded once; the engine evicted it and has nothing to load it again from "
                                   "(keep max_loras at 1: the actor's adapter is the only one)")
            return from_folder(lora_request)

        manager._load_adapter = load
    return True


def _adapter_from_memory(manager: Any, lora_request: Any, tensors: dict[str, torch.Tensor],
                         config: dict[str, Any]) -> Any:
    """The `LoRAModel` vLLM's folder loader would build from a folder holding `tensors` and `config`: the same
    config checks, target-module check, name mapping and dtype, through `LoRAModel.from_lora_tensors`."""
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.utils import parse_fine_tuned_lora_name

    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    adapters = manager._adapter_manager
    model = adapters.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None and hasattr(mapper, "get_rename_mapper"):  # vLLM 0.32 maps names only (0.24: as is)
        mapper = mapper.get_rename_mapper()
    expected = set()
    for module in adapters.supported_lora_modules:
        expected.update(adapters.packed_modules_mapping.get(module, [module]))
    unexpected = sorted({name for name in (parse_fine_tuned_lora_name(key, mapper)[0] for key in tensors)
                         if name.rsplit(".", 1)[-1] not in expected | set(helper.modules_to_save or ())})
    if unexpected:
        raise ValueError(f"LoRA adapter {lora_request.lora_name}: modules {unexpected[:4]} are not among the "
                         f"engine's LoRA targets {sorted(expected)}")
    lora = manager._lora_model_cls.from_lora_tensors(
        lora_model_id=lora_request.lora_int_id, tensors=tensors, peft_helper=helper, device="cpu",
        dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size, weights_mapper=mapper,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    lora.is_3d_lora_weight = getattr(lora_request, "is_3d_lora_weight", False)
    for check in ("_validate_moe_lora_format", "_validate_modules_to_save", "_validate_token_classification_lora"):
        if hasattr(adapters, check):  # vLLM 0.32's checks of a loaded adapter (0.24 has none of them)
            getattr(adapters, check)(lora)
    return lora


@ROLLOUT_REGISTRY.register("vllm")
class VLLMRollout(BaseRollout):
    """In-process vLLM engine. `name_map` renames HF weight names for archs whose vLLM names differ
    (Qwen2/Llama: identical, so None). `lora_rank` > 0: the engine keeps the base weights and serves the
    actor's LoRA adapter (`load_adapter`); its sleep then keeps the weights in host memory (level 1), since
    they are not re-synced each step."""

    agent_tp_mode = "lockstep"  # external_launcher: every TP rank steps its engine (`rlpost.rollout.lockstep`)

    def __init__(
        self,
        config: Any,
        model_path: str,
        tokenizer: Any,
        device: str,
        module: torch.nn.Module | None = None,
        name_map: Callable[[str], str] | None = None,
        lora_rank: int = 0,
    ) -> None:
        self.config, self.tokenizer, self.device, self.name_map = config, tokenizer, device, name_map
        self.free_cache_engine = config.free_cache_engine
        # With an actor in this process every generation can be preceded by a weight sync, so sleep drops
        # the weights (level 2) instead of copying them to host memory and back only to overwrite them.
        self.sleep_level = 2 if module is not None and lora_rank == 0 else 1
        self.lora_request: Any = None  # the adapter served since the last `load_adapter`
        self._memory_adapters: bool | None = None  # whether `load_adapter_tensors` works (None: not tried yet)
        self._asleep: tuple[str, ...] = ()
        self.rank, _ = _rank_world()
        self.last_sync_breakdown: dict[str, float] = {}
        kwargs = engine_kwargs(config, model_path, device, lora_rank)
        apply_engine_env(engine_env(config, device))
        self.vision = _is_vision_language(model_path)
        if self.vision:
            # the processor loads without torchvision (images only); no video: its dummy profiling input would
            # need the video processor. engine_kwargs.vllm.limit_mm_per_prompt still wins.
            inspect_vllm_models_in_process()
            kwargs.setdefault("limit_mm_per_prompt", {"video": 0})
        if lora_rank > 0:
            kwargs["load_format"] = "auto"  # the frozen base comes from model_path, only the adapter is synced
        if device == "cpu" and config.tensor_model_parallel_size > 1:
            tag_cpu_shm_names(os.environ.get("MASTER_PORT", ""))
        start = time.perf_counter()
        self.llm = LLM(**kwargs)
        logger.info("vLLM engine started in %.1f s (%s, %s)", time.perf_counter() - start, device, kwargs["dtype"])

    @property
    def sleeping(self) -> bool:
        """True while any engine memory (weights or KV cache) is released."""
        return bool(self._asleep)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """See `BaseRollout.generate_sequences`; one vLLM request per row."""
        spec = resolve_sampling(self.config, prompts.meta_info)
        stop_ids = eos_id_set(prompts.meta_info.get(keys.META_EOS_TOKEN_ID))
        requests = [{"prompt_token_ids": ids} for ids in prompt_token_lists(prompts)]
        mm_data = prompts.non_tensor_batch.get(keys.MULTI_MODAL_DATA) if prompts.non_tensor_batch else None
        if mm_data is not None:  # each row's images; its prompt holds one image token per image
            for request, data in zip(requests, mm_data):
                if data:
                    request["multi_modal_data"] = dict(data)
        params: SamplingParams | list[SamplingParams] = sampling_params(spec, stop_ids)
        caps = row_caps(prompts, spec.max_tokens)
        if caps is not None:  # per-sample caps: the engine stops each row at its own, not at the longest
            params = [sampling_params(replace(spec, max_tokens=cap), stop_ids) for cap in caps]
        outputs = self.llm.generate(
            requests, params, use_tqdm=self.rank == 0 and len(requests) > 64,
            lora_request=self.lora_request,
        )
        token_ids = [list(o.outputs[0].token_ids) for o in outputs]
        log_probs = [_sampled_log_probs(o.outputs[0]) for o in outputs] if spec.logprobs else None
        return assemble_output(prompts, token_ids, spec.max_tokens, log_probs)

    def agent_engine(self, stop_ids: set[int]) -> VLLMStepEngine:
        """Continuous batching over this engine for the agent loops (see `VLLMStepEngine`)."""
        return VLLMStepEngine(self.llm, stop_ids, self.lora_request)

    def load_adapter(self, path: str) -> None:
        """Serve the PEFT adapter folder `path` from the next request on, replacing the previous one (a new
        adapter id makes vLLM load the new tensors). Clears the prefix cache: cached KV used the old adapter."""
        self._serve_adapter(path)

    def load_adapter_tensors(self, tensors: dict[str, torch.Tensor], peft_config: Any) -> bool:
        """Serve the adapter `tensors` (PEFT's saved names, `rlpost.engine.lora.adapter_tensors`) with its
        `peft.LoraConfig`, handed to the engine's worker in memory: no folder is written or read. As
        `load_adapter` otherwise (a new adapter id each time: the engine never serves a cached older one).
        The engine takes the tensors over (they are not copied, and vLLM scales lora_B in place): pass tensors
        nothing else reads.

        Returns:
            False, loading nothing, when this engine's worker has no adapter loader to extend (the caller then
            writes a folder for `load_adapter`).
        """
        if self._memory_adapters is None:
            self._memory_adapters = all(self.llm.collective_rpc(_install_memory_adapter_loader))
            if not self._memory_adapters:
                logger.warning("vLLM %s: no worker-side adapter loader to extend; the LoRA adapter goes through a "
                               "folder", vllm.__version__)
        if not self._memory_adapters:
            return False
        config = _peft_config_dict(peft_config)
        new_id = self._next_adapter_id()

        def _stage(worker: Any) -> None:  # the worker holds only the adapter it is about to load
            staged = _memory_adapters(worker)
            staged.clear()
            staged[new_id] = (tensors, config)

        self.llm.collective_rpc(_stage)
        self._serve_adapter(f"{MEMORY_ADAPTER_PREFIX}actor_{new_id}")
        return True

    def _next_adapter_id(self) -> int:
        return 1 if self.lora_request is None else self.lora_request.lora_int_id + 1

    def _serve_adapter(self, path: str) -> None:
        from vllm.lora.request import LoRARequest

        start = time.perf_counter()
        self._wake_weights()  # the adapter slots live in the weights' memory
        woke = time.perf_counter()
        old = self.lora_request
        new_id = self._next_adapter_id()
        self.lora_request = LoRARequest(f"actor_{new_id}", new_id, path)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
        self.llm.llm_engine.add_lora(self.lora_request)
        self.llm.reset_prefix_cache()
        if self.device == "cuda":
            torch.cuda.synchronize()  # the slot copies are queued on the stream: count them here
        end = time.perf_counter()
        self.last_sync_breakdown = {"wake": woke - start, "adapter": end - woke}

    def _named(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named_tensors:
            yield (self.name_map(name) if self.name_map else name), tensor

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream tensors into the engine's model, in place: the iterator is consumed lazily by the
        model's own `load_weights`, so at most one incoming tensor is alive besides the engine's copy.

        Unquantized models on GPU load straight through each parameter's weight loader (which also takes this
        rank's tensor-parallel shard); vLLM's `reload_weights` would first rebuild every layer on the
        meta device, load into fresh buffers and copy those back - a second copy of every weight.
        Quantized models and CPU keep `reload_weights` (their kernels re-process weights after a load).
        Clears the prefix cache (and a vision model's encoder cache) afterwards: both were computed with the old
        weights. A vision model gets its image normalisation back (`restore_image_normalization`).
        `last_sync_breakdown` holds the seconds of each part (wake, load, reset)."""
        weights, device, vision = self._named(named_tensors), self.device, self.vision
        direct = self._direct_load
        start = time.perf_counter()
        self._wake_weights()
        woke = time.perf_counter()

        def _load(worker: Any) -> None:
            runner = getattr(worker, "model_runner", worker)
            if direct:
                with torch.no_grad():
                    runner.model.load_weights(weights)
            else:
                (getattr(worker, "reload_weights", None) or runner.reload_weights)(weights_iterator=weights)
            if device != "cuda":
                _refresh_cpu_packed(runner.model)
            if vision:
                restore_image_normalization(runner)

        self.llm.collective_rpc(_load)
        if device == "cuda":
            torch.cuda.synchronize()  # the copies are queued on the stream: count them here
        loaded = time.perf_counter()
        self.llm.reset_prefix_cache()
        if self.vision:
            # vision embeddings of the old weights: the runner's copy is gone after a reload while the scheduler
            # would still count them as cached (an image seen again then misses); drop both
            self.llm.llm_engine.reset_encoder_cache()
        self.needs_sync = False
        end = time.perf_counter()
        self.last_sync_s = end - start
        self.last_sync_breakdown = {"wake": woke - start, "load": loaded - woke, "reset": end - loaded}
        logger.info("vLLM weights synced in %.3f s (%s)", self.last_sync_s,
                    ", ".join(f"{k} {v:.3f}" for k, v in self.last_sync_breakdown.items()))

    def _wake_weights(self) -> None:
        """Wake the weights only (after a sleep); the KV cache stays released until `wake_up`."""
        if "weights" in self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._asleep = tuple(t for t in self._asleep if t != "weights")
            set_unbacked_bytes(sleeping_pool_bytes(awake=("weights",)))

    @property
    def _direct_load(self) -> bool:
        """True when `model.load_weights` may write into the live parameters: GPU and no quantization.
        (On CPU, loading re-packs each linear layer and drops the plain weight, so `reload_weights` is
        the only way in.)"""
        return self.device == "cuda" and getattr(self.llm.llm_engine.model_config, "quantization", None) is None

    def sleep(self) -> None:
        """GPU with free_cache_engine: KV cache dropped; weights dropped too (level 2) when an actor will
        re-sync them (`needs_sync` until then), else offloaded to host memory (level 1).
        CPU: vLLM has no sleep mode there; only the prefix cache is dropped."""
        if self._asleep:
            return
        if self.device == "cuda" and self.free_cache_engine:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = ("weights", "kv_cache")
            set_unbacked_bytes(sleeping_pool_bytes())
            self.needs_sync = self.sleep_level == 2
        else:
            self.llm.reset_prefix_cache()

    def wake_up(self) -> None:
        """Undo `sleep` (what `update_weights` has not woken already); call before the next generation.

        Raises:
            RuntimeError: after a level-2 sleep without an `update_weights` since (no valid weights).
        """
        if not self._asleep:
            return
        if self.needs_sync:
            raise RuntimeError("vLLM dropped its weights in a level-2 sleep: call update_weights before wake_up")
        self.llm.wake_up(tags=None if len(self._asleep) == 2 else list(self._asleep))
        self._asleep = ()
        set_unbacked_bytes(0)
