"""A generative reward model (an LLM judge): the judge request, the verdict's score, and verl's reward loop.

`reward_model.judge` (`rlpost.config.schema_judge.JudgeConfig`) says how a (prompt, response, ground truth) becomes
an OpenAI-style request and how the reply becomes a score. The judge is any OpenAI-compatible server: rlpost's own
(`rlpost.workers.judge_server`, vLLM in the judge's pool) or `judge.url`. Requests go out through the `openai`
client, at most `max_concurrency` in flight. No Ray, no vLLM here.

verl's reward loop: a custom reward function that names `reward_router_address` (and `reward_model_tokenizer`) in
its signature gets the judge server's HOST:PORT (and the judge's tokenizer) and may be `async`; the samples of a
batch are scored concurrently.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import math
import re
import time
from typing import Any, Callable

from rlpost.reward import base
from rlpost.utils.registry import Registry

PARSERS = Registry("judge parser")
APIS = ("chat", "completions")
PARSE_FAILED = "judge_parse_failed"  # per-row extra: 1 when the reply held no score (scored failure_score)
LATENCY = "judge_latency_s"  # per-row extra: seconds from sending the request to the reply
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
for _name in ("httpx", "httpx2"):  # one INFO line per judge request otherwise
    logging.getLogger(_name).setLevel(logging.WARNING)


def generative_judge(cfg: Any) -> bool:
    """True when the config's reward model is a generative judge: `reward_model.enable` with
    `reward_model.judge.enable`, or verl's reward loop (`use_reward_loop`) with a custom reward function."""
    rm = cfg.reward_model
    return bool(rm.enable) and bool(rm.judge.enable or (rm.use_reward_loop and cfg.custom_reward_function.path))


@PARSERS.register("last_number")
def last_number(text: str, cfg: Any) -> float | None:
    """The last number in `text` ("7/10 ... so 8" -> 8.0), or None."""
    found = _NUMBER.findall(text)
    return float(found[-1]) if found else None


@PARSERS.register("regex")
def regex_number(text: str, cfg: Any) -> float | None:
    """Group 1 of the first match of `cfg.pattern` as a number, or None (no match, or not a number)."""
    match = re.search(cfg.pattern, text)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except (TypeError, ValueError):
        return None


@PARSERS.register("json")
def json_number(text: str, cfg: Any) -> float | None:
    """`cfg.json_key` of the first JSON object in `text` that has it ('... {"score": 7} ...' -> 7.0), or None."""
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            obj, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(obj, dict) and cfg.json_key in obj:
            try:
                return float(obj[cfg.json_key])
            except (TypeError, ValueError):
                return None
    return None


def verdict_score(text: str, cfg: Any) -> tuple[float, bool]:
    """(score, parsed) of a judge reply: the parser's number, divided by `max_score` and clamped to [0, 1] when
    that is set; `(failure_score, False)` when the parser finds no finite number."""
    value = PARSERS.get(cfg.parser)(text, cfg)
    if value is None or not math.isfinite(value):
        return float(cfg.failure_score), False
    if cfg.max_score is not None:
        value = min(max(value / cfg.max_score, 0.0), 1.0)
    return value, True


def render_prompt(template: str, prompt: str, response: str, ground_truth: Any) -> str:
    """`template` with {prompt}, {response} and {ground_truth} replaced (other braces kept as written, so JSON
    examples in a template need no escaping)."""
    values = {"prompt": prompt, "response": response, "ground_truth": "" if ground_truth is None else str(ground_truth)}
    return re.sub(r"\{(prompt|response|ground_truth)\}", lambda m: values[m.group(1)], template)


def judge_request(cfg: Any, sample: base.Sample, model: str) -> dict[str, Any]:
    """The request body for one sample: `messages` (api=chat: optional system message, then the rendered
    template as the user message) or `prompt` (api=completions), plus the model and sampling settings."""
    text = render_prompt(cfg.prompt_template, sample.prompt_str, sample.response_str, sample.ground_truth)
    body: dict[str, Any] = {"model": model, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                            "top_p": cfg.top_p}
    if cfg.api == "completions":
        return {**body, "prompt": text}
    system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return {**body, "messages": [*system, {"role": "user", "content": text}]}


class JudgeEndpoint:
    """Where the judge answers: one or more HOST:PORT (rlpost's servers, one per engine) or a base URL, handed
    out round-robin; filled in once the judge's pool has started (`set_addresses`)."""

    def __init__(self, url: str | None, model: str) -> None:
        self.model = model
        self.addresses: list[str] = [url] if url else []
        self._next = itertools.count()

    def set_addresses(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)

    def next_address(self) -> str:
        if not self.addresses:
            raise RuntimeError("the judge's servers have not started (RayPPOTrainer.init_workers starts them)")
        return self.addresses[next(self._next) % len(self.addresses)]


def base_url(address: str) -> str:
    """The OpenAI client's base URL of a judge address: a URL as given, a HOST:PORT as http://HOST:PORT/v1."""
    return address.rstrip("/") if "://" in address else f"http://{address}/v1"


async def chat_complete(router_address: str, chat_complete_request: dict[str, Any], timeout_s: float = 300.0) -> Any:
    """verl's reward-loop helper: POST `chat_complete_request` (messages, model, sampling settings) to the judge at
    `router_address` (HOST:PORT or a base URL); returns the `openai` ChatCompletion."""
    from openai import AsyncOpenAI

    request = dict(chat_complete_request)
    async with AsyncOpenAI(base_url=base_url(router_address), api_key="EMPTY", timeout=timeout_s,
                           max_retries=0) as client:
        return await client.chat.completions.create(**request)


async def _ask(client_for: Callable[[str], Any], endpoint: JudgeEndpoint, request: dict[str, Any], api: str) -> str:
    client = client_for(endpoint.next_address())
    if api == "completions":
        reply = await client.completions.create(**request)
        return reply.choices[0].text or ""
    reply = await client.chat.completions.create(**request)
    return reply.choices[0].message.content or ""


def score_with_judge(cfg: Any, endpoint: JudgeEndpoint, samples: list[base.Sample]) -> list[dict[str, Any]]:
    """The built-in judge scorer: one request per sample, at most `cfg.max_concurrency` in flight; each result is
    `{"score", judge_parse_failed (0/1), judge_latency_s}`. A request that fails raises `RewardFunctionError`
    naming the sample."""
    from openai import AsyncOpenAI

    async def run() -> list[dict[str, Any]]:
        clients: dict[str, Any] = {}

        def client_for(address: str) -> Any:
            if address not in clients:
                clients[address] = AsyncOpenAI(base_url=base_url(address), api_key="EMPTY", timeout=cfg.timeout_s,
                                               max_retries=0)
            return clients[address]

        gate = asyncio.Semaphore(cfg.max_concurrency)

        async def one(sample: base.Sample) -> dict[str, Any]:
            async with gate:
                start = time.perf_counter()
                try:
                    text = await _ask(client_for, endpoint, judge_request(cfg, sample, endpoint.model), cfg.api)
                except Exception as exc:  # noqa: BLE001 - re-raised naming the sample
                    raise base.RewardFunctionError(sample.data_source, sample.index,
                                                   f"the judge request failed: {exc!r}") from exc
                score, parsed = verdict_score(text, cfg)
                return {"score": score, PARSE_FAILED: int(not parsed), LATENCY: time.perf_counter() - start}

        try:
            return list(await asyncio.gather(*(one(s) for s in samples)))
        finally:
            for client in clients.values():
                await client.close()

    return asyncio.run(run())


def reward_loop_kwargs(fn: Callable[..., Any]) -> set[str]:
    """Which of verl's reward-loop arguments `fn` takes (by name, or all of them through **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"reward_router_address", "reward_model_tokenizer"}
    return {"reward_router_address", "reward_model_tokenizer"} & set(params)


def run_reward_loop(fn: Callable[..., Any], samples: list[base.Sample], endpoint: JudgeEndpoint,
                    judge_tokenizer: Any, max_concurrency: int) -> list[Any]:
    """verl's reward loop: `fn(data_source, solution_str, ground_truth, extra_info[, reward_router_address,
    reward_model_tokenizer])` on every sample, at most `max_concurrency` at once (an `async def` fn on the event
    loop, a plain one in a thread); returns its results in sample order."""
    wanted = reward_loop_kwargs(fn)
    is_async = inspect.iscoroutinefunction(getattr(fn, "func", fn))

    async def run() -> list[Any]:
        gate = asyncio.Semaphore(max_concurrency)

        async def one(sample: base.Sample) -> Any:
            extra = {"reward_router_address": endpoint.next_address(), "reward_model_tokenizer": judge_tokenizer}
            call = {k: v for k, v in extra.items() if k in wanted}
            bound = lambda **kw: fn(**call, **kw)  # noqa: E731 - base.call_reward_fn names the sample on errors
            async with gate:
                if is_async:
                    try:
                        return await bound(data_source=sample.data_source, solution_str=sample.response_str,
                                           ground_truth=sample.ground_truth, extra_info=sample.extra_info)
                    except Exception as exc:  # noqa: BLE001 - re-raised naming the sample
                        import traceback

                        raise base.RewardFunctionError(sample.data_source, sample.index, repr(exc),
                                                       traceback.format_exc()) from exc
                return await asyncio.to_thread(base.call_reward_fn, bound, sample)

        return list(await asyncio.gather(*(one(s) for s in samples)))

    return asyncio.run(run())


def judge_metrics(extra: dict[str, Any]) -> dict[str, float]:
    """`reward/judge/*` of a batch from the built-in scorer's per-row extras: parse_failure_count, requests and
    latency_s_mean / latency_s_max (empty without them)."""
    failed = extra.get(PARSE_FAILED)
    if failed is None:
        return {}
    latency = [float(x) for x in extra[LATENCY]]
    return {"reward/judge/parse_failure_count": float(sum(int(x) for x in failed)),
            "reward/judge/requests": float(len(failed)),
            "reward/judge/latency_s_mean": sum(latency) / max(len(latency), 1),
            "reward/judge/latency_s_max": max(latency, default=0.0)}
