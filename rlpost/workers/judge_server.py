"""The judge's pool: `reward_model.model.path` served by vLLM behind an OpenAI-compatible HTTP server, one engine
per device of its own Ray placement group (`reward_model.nnodes x n_gpus_per_node`).

Each `JudgeServer` actor holds an in-process `vllm.LLM` and an aiohttp server (`/v1/chat/completions`,
`/v1/completions`, `/v1/models`) on a thread of its own. Requests wait in a queue; one engine thread takes what has
arrived (up to `reward_model.rollout.max_num_seqs`) and generates it as one batch, so many clients in flight share
engine steps. The reward manager (`rlpost.reward.judge_manager`) is the client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
import time
import uuid
from typing import Any

logger = logging.getLogger(__name__)

PG_READY_S = 300.0  # how long the judge's devices may take to be granted before the run stops


def served_judge(config: Any) -> bool:
    """True when rlpost serves the judge itself: a generative reward model without `judge.url`."""
    from rlpost.reward.judge import generative_judge

    return generative_judge(config) and config.reward_model.judge.url is None


def judge_devices(config: Any) -> int:
    """Devices of the judge's own pool (0 when rlpost serves no judge)."""
    rm = config.reward_model
    return rm.nnodes * rm.n_gpus_per_node if served_judge(config) else 0


def judge_engine_kwargs(config: Any) -> dict[str, Any]:
    """`vllm.LLM(...)` keyword arguments of one judge engine, from `reward_model.rollout` (pure)."""
    rm = config.reward_model
    r = rm.rollout
    path = os.path.expanduser(str(rm.model.path))
    max_len = r.max_model_len or (r.prompt_length + r.response_length)
    extra = dict((r.engine_kwargs or {}).get("vllm") or {})
    return {"model": path, "tokenizer": path, "dtype": r.dtype, "max_model_len": max_len,
            "max_num_seqs": r.max_num_seqs, "max_num_batched_tokens": max(r.max_num_batched_tokens, max_len),
            "enforce_eager": r.enforce_eager, "enable_prefix_caching": r.enable_prefix_caching,
            "enable_chunked_prefill": r.enable_chunked_prefill, "gpu_memory_utilization": r.gpu_memory_utilization,
            "tensor_parallel_size": 1, "trust_remote_code": rm.model.trust_remote_code,
            "disable_log_stats": r.disable_log_stats, **extra}


class JudgeServer:
    """One judge engine and its HTTP server (a Ray actor). `address()` is its HOST:PORT."""

    def __init__(self, engine_kwargs: dict[str, Any], served_name: str, rank: int = 0) -> None:
        from rlpost.single_controller.ray.diagnostics import setup_worker_process

        setup_worker_process(rank, "judge")  # engine output to the run's log folder unless verbose_engine_logs
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine stays in this process
        from vllm import LLM

        start = time.perf_counter()
        self.llm = LLM(**engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = int(engine_kwargs["max_model_len"])
        self.max_batch = int(engine_kwargs["max_num_seqs"])
        self.names = {served_name, engine_kwargs["model"]}
        self.served_name = served_name
        self.requests: queue.Queue = queue.Queue()
        self.served, self.batches, self.largest_batch = 0, 0, 0
        threading.Thread(target=self._engine_loop, name="judge-engine", daemon=True).start()
        self._address = self._start_http()
        logger.info("judge engine started in %.1f s at %s", time.perf_counter() - start, self._address)

    def address(self) -> str:
        return self._address

    def stats(self) -> dict[str, int]:
        """Requests answered, engine batches run and the largest batch so far."""
        return {"served": self.served, "batches": self.batches, "largest_batch": self.largest_batch}

    # -- the engine thread: the only caller of self.llm --------------------------------------------------------

    def _engine_loop(self) -> None:
        while True:
            batch = [self.requests.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.requests.get_nowait())
                except queue.Empty:
                    break
            try:
                outs = self.llm.generate([{"prompt_token_ids": ids} for ids, _, _ in batch],
                                         sampling_params=[params for _, params, _ in batch], use_tqdm=False)
            except Exception as exc:  # noqa: BLE001 - every waiting request hears of it
                for _, _, fut in batch:
                    fut.set_exception(exc)
                continue
            self.batches += 1
            self.largest_batch = max(self.largest_batch, len(batch))
            for (_, _, fut), out in zip(batch, outs):
                self.served += 1
                fut.set_result(out.outputs[0])

    # -- the HTTP side --------------------------------------------------------------------------------------------

    def _start_http(self) -> str:
        import ray
        from aiohttp import web

        host = ray.util.get_node_ip_address()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            app = web.Application(client_max_size=64 * 2**20)
            app.add_routes([web.post("/v1/chat/completions", self._chat), web.post("/v1/completions", self._complete),
                            web.get("/v1/models", self._models)])
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, 0)
            loop.run_until_complete(site.start())
            ready.set_result(site._server.sockets[0].getsockname()[1])
            loop.run_forever()

        threading.Thread(target=serve, name="judge-http", daemon=True).start()
        return f"{host}:{ready.result(timeout=60)}"

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.served_name, "object": "model"}]})

    async def _chat(self, request: Any) -> Any:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages: a non-empty list of {role, content} is required")
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # tokenizers that return a BatchEncoding
            ids = ids["input_ids"]
        return await self._answer(body, list(ids), chat=True)

    async def _complete(self, request: Any) -> Any:
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return _error(400, "prompt: a string is required")
        return await self._answer(body, self.tokenizer.encode(prompt, add_special_tokens=False), chat=False)

    async def _answer(self, body: dict[str, Any], ids: list[int], chat: bool) -> Any:
        from aiohttp import web
        from vllm import SamplingParams

        if body.get("model") not in (None, *self.names):
            return _error(404, f"model {body.get('model')!r} is not served here; this server has {self.served_name!r}")
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if len(ids) + max_tokens > self.max_model_len:
            return _error(400, f"the request has {len(ids)} prompt tokens + max_tokens={max_tokens} > the judge's "
                               f"max_model_len={self.max_model_len} (reward_model.rollout.prompt_length + "
                               "response_length, or max_model_len)")
        params = SamplingParams(max_tokens=max_tokens, temperature=float(body.get("temperature", 1.0)),
                                top_p=float(body.get("top_p", 1.0)), seed=body.get("seed"))
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.requests.put((ids, params, fut))
        out = await asyncio.wrap_future(fut)
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(out.token_ids),
                 "total_tokens": len(ids) + len(out.token_ids)}
        choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason or "stop", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        return web.json_response({"id": f"judge-{uuid.uuid4().hex}", "created": int(time.time()),
                                  "object": "chat.completion" if chat else "text_completion",
                                  "model": self.served_name, "choices": [choice], "usage": usage})


def _error(status: int, message: str) -> Any:
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


class JudgePool:
    """The judge's placement group and its servers (kept alive as long as this object)."""

    def __init__(self, placement_group: Any, servers: list[Any], addresses: list[str]) -> None:
        self.placement_group, self.servers, self.addresses = placement_group, servers, addresses

    def stats(self) -> list[dict[str, int]]:
        import ray

        return ray.get([s.stats.remote() for s in self.servers])


def start_judge_pool(config: Any, served_name: str) -> JudgePool:
    """Reserve the judge's devices (one bundle each, PACK) and start one `JudgeServer` per device."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    devices, gpu = judge_devices(config), config.trainer.device == "cuda"
    bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
    pg = placement_group([dict(bundle) for _ in range(devices)], strategy="PACK", name="judge_pool")
    try:
        ray.get(pg.ready(), timeout=PG_READY_S)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(f"the judge's pool of {devices} device(s) (reward_model.nnodes x n_gpus_per_node) was not "
                           f"granted in {PG_READY_S:.0f} s: the cluster lacks them beside the trainer's") from None
    actor = ray.remote(JudgeServer)
    kwargs = judge_engine_kwargs(config)
    servers = [actor.options(num_cpus=1, num_gpus=1 if gpu else 0, name=f"judge_server_{i}",
                             scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
               .remote(kwargs, served_name, i) for i in range(devices)]
    addresses = ray.get([s.address.remote() for s in servers])
    print(f"[rlpost] judge: {devices} vLLM server(s) of {kwargs['model']} at {', '.join(addresses)}")
    return JudgePool(pg, servers, addresses)


def start_judge(config: Any, *reward_fns: Any) -> JudgePool | None:
    """Start the judge's pool when rlpost serves the judge and point the reward managers at it."""
    from rlpost.reward.judge_manager import JudgeRewardManager, judge_model_name

    if not served_judge(config):
        return None
    pool = start_judge_pool(config, judge_model_name(config))
    for fn in reward_fns:
        if isinstance(fn, JudgeRewardManager):
            fn.endpoint.set_addresses(pool.addresses)
    return pool
