"""An OpenAI-compatible HTTP endpoint in front of the rollout engine, for agents that run outside the trainer.

    POST /v1/chat/completions     messages (+ tools) -> one assistant turn (stream or not)
    POST /v1/completions          prompt text (or token ids) -> one completion (stream or not)
    GET  /v1/models               the one served model
    (the same under /t/<trajectory id>/v1/..., so an unmodified client only needs its base URL)

Every request belongs to one trajectory, named by the base-URL prefix `/t/<id>`, the `X-Trajectory-Id` header
or the body's `user` field; the trajectory must have been opened by the trainer (`open`). The server records
each turn's exact token ids and log-probs and folds a conversation into one trajectory as the in-process agent
loops do (`rlpost.agent.trajectory.TrajectoryBuilder`): a model turn keeps the sampled ids (mask 1), the
messages the agent adds after it (tool results, its own user text) become the chat template's delta (mask 0).
A request whose history does not continue the recorded one (the agent rewrote or truncated it) starts the
trajectory over (`history_resets` counts it). The trainer's sampling settings are used for every call (the loss
assumes the rollout policy): a request's temperature, top_p, stop and seed are not applied; its `max_tokens`
only lowers the remaining response budget. Streams carry the finished turn as deltas (one per token).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from rlpost.agent.base import AgentLoopOutput, GenerateFn
from rlpost.agent.tool_parser import get_tool_parser
from rlpost.agent.trajectory import TrajectoryBuilder, decode, encode

MODEL_NAME = "rlpost-policy"
TRAJECTORY_HEADER = "X-Trajectory-Id"


class RequestError(Exception):
    """A request the server refuses; `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class CompletionTrack:
    """A `/v1/completions` trajectory: the text the agent has seen, and its ids with masks.

    Attributes:
        prompt_ids: (P,) the first prompt. response_ids / response_mask / logprobs: (R,) completions (mask 1)
            and the text the agent appended between them (mask 0, log-prob 0.0).
        text: prompt + completions + appended text as strings (a continuing prompt starts with it).
        ids: the same as token ids (prompts given as ids continue it).
    """

    prompt_ids: list[int]
    text: str | None
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


@dataclass
class TrajectoryRecord:
    """What the server saw of one trajectory.

    Attributes:
        turns: per model call, {"prompt_ids", "completion_ids", "logprobs"} exactly as the engine used them.
        builder / track: the chat or completions trajectory (whichever endpoint the agent uses).
        seen: number of messages of the chat conversation `builder` holds.
        history_resets: requests whose history did not continue the recorded one.
        errors: requests refused or failed.
    """

    trajectory_id: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    builder: TrajectoryBuilder | None = None
    track: CompletionTrack | None = None
    seen: int = 0
    history_resets: int = 0
    errors: int = 0
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class OpenAIServer:
    """The endpoint of one rollout worker's `generate_sequences` call (one asyncio loop, the engine's).

    Args:
        generate: the engine's async generate (contract in `rlpost.agent.base`).
        tokenizer: the policy tokenizer with its chat template.
        sampling_params: the trainer's sampling settings (passed to `generate` with `max_tokens`).
        response_length: token budget of one trajectory's whole response (all turns).
        tool_format: tool-call format of the model's output (`multi_turn.format`), parsed into `tool_calls`.
        template_kwargs: extra `apply_chat_template` arguments.
        host / port: where to listen (port 0: a free port).
    """

    def __init__(self, generate: GenerateFn, tokenizer: Any, sampling_params: dict[str, Any], response_length: int,
                 tool_format: str = "hermes", template_kwargs: dict | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.generate, self.tokenizer, self.params = generate, tokenizer, dict(sampling_params)
        self.response_length, self.template_kwargs = response_length, dict(template_kwargs or {})
        self.parse_tools = get_tool_parser(tool_format)
        self.host, self.port = host, port
        self.records: dict[str, TrajectoryRecord] = {}
        self._runner: Any = None
        self.ready: asyncio.Future | None = None  # the start of a server shared by several callers

    # --- life cycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("", "/t/{tid}"):
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
            app.router.add_get(prefix + "/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def base_url(self, trajectory_id: str | None = None) -> str:
        """`http://host:port/v1`, or the trajectory's own `.../t/<id>/v1`."""
        prefix = f"/t/{trajectory_id}" if trajectory_id else ""
        return f"http://{self.host}:{self.port}{prefix}/v1"

    def open(self, trajectory_id: str | None = None) -> str:
        """Register a trajectory; returns its id."""
        tid = trajectory_id or uuid.uuid4().hex
        self.records[tid] = TrajectoryRecord(tid)
        return tid

    def close(self, trajectory_id: str) -> TrajectoryRecord:
        """Stop serving the trajectory (later requests get HTTP 410) and hand back its record."""
        record = self.records[trajectory_id]
        record.closed = True
        return record

    # --- HTTP handlers -----------------------------------------------------------------------------------
    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": MODEL_NAME, "object": "model",
                                                              "owned_by": "rlpost"}]})

    async def _chat(self, request: Any) -> Any:
        return await self._serve(request, self._chat_turn, "chat.completion")

    async def _completions(self, request: Any) -> Any:
        return await self._serve(request, self._completion_turn, "text_completion")

    async def _serve(self, request: Any, turn: Any, kind: str) -> Any:
        from aiohttp import web

        record = None
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError(400, "the request body must be a JSON object")
            record = self._record(request, body)
            if int(body.get("n") or 1) != 1:
                raise RequestError(400, f"n={body.get('n')}: each call is one turn of one trajectory; send n=1")
            async with record.lock:
                result = await turn(record, body)
        except RequestError as err:
            if record is not None:
                record.errors += 1
            return web.json_response({"error": {"message": str(err), "type": "invalid_request_error",
                                                "code": err.status}}, status=err.status)
        except json.JSONDecodeError as err:
            return web.json_response({"error": {"message": f"the body is not JSON: {err}",
                                                "type": "invalid_request_error", "code": 400}}, status=400)
        except Exception as err:  # the engine failed: the agent sees a server error, the record counts it
            if record is not None:
                record.errors += 1
            return web.json_response({"error": {"message": f"{type(err).__name__}: {err}", "type": "server_error",
                                                "code": 500}}, status=500)
        if body.get("stream"):
            return await self._stream(request, kind, result, bool((body.get("stream_options") or {})
                                                                  .get("include_usage")))
        return web.json_response(_response(kind, result, bool(body.get("logprobs")), self.tokenizer))

    def _record(self, request: Any, body: dict) -> TrajectoryRecord:
        tid = request.match_info.get("tid") or request.headers.get(TRAJECTORY_HEADER) or body.get("user")
        if not tid:
            raise RequestError(400, f"no trajectory id: use the base URL the trainer gave (.../t/<id>/v1), the "
                                    f"{TRAJECTORY_HEADER} header or the 'user' field")
        record = self.records.get(str(tid))
        if record is None:
            raise RequestError(404, f"trajectory {tid!r} is not open on this server")
        if record.closed:
            raise RequestError(410, f"trajectory {tid!r} has ended (its program's time is up)")
        return record

    # --- one turn ----------------------------------------------------------------------------------------
    async def _sample(self, record: TrajectoryRecord, context: list[int], budget: int, body: dict) -> dict:
        """Generate at most `budget` tokens (the request's max_tokens, if lower) after `context`."""
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        limit = min(budget, int(asked)) if asked else budget
        if limit <= 0:
            return {"ids": [], "logprobs": [], "finish": "length"}
        ids, logprobs = await self.generate(list(context), {**self.params, "max_tokens": limit})
        ids = [int(t) for t in ids][:limit]
        logprobs = None if logprobs is None else [float(x) for x in logprobs][: len(ids)]
        record.turns.append({"prompt_ids": list(context), "completion_ids": ids, "logprobs": logprobs})
        ended = bool(ids) and ids[-1] == self.tokenizer.eos_token_id
        return {"ids": ids, "logprobs": logprobs, "finish": "stop" if ended else "length"}

    async def _chat_turn(self, record: TrajectoryRecord, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list")
        messages = [_plain_message(m) for m in messages]
        tools = body.get("tools") or None
        if record.track is not None:
            raise RequestError(400, "this trajectory uses /v1/completions; one trajectory uses one endpoint")
        builder = record.builder
        if builder is None or not _continues(builder.messages, messages):
            if builder is not None:
                record.history_resets += 1
            builder = record.builder = TrajectoryBuilder(self.tokenizer, messages, self.response_length, tools,
                                                         self.template_kwargs)
        elif not builder.add_messages(messages[len(builder.messages):]):
            return {"ids": [], "logprobs": [], "finish": "length", "text": "", "calls": []}
        out = await self._sample(record, builder.prompt_ids + builder.response_ids, builder.remaining, body)
        builder.add_model_turn(out["ids"], out["logprobs"])
        parsed = self.parse_tools(decode(self.tokenizer, out["ids"], skip_special_tokens=True))
        calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                 for c in parsed.calls]
        if calls:
            out["finish"] = "tool_calls"
        return {**out, "text": parsed.content if calls else builder.messages[-1]["content"], "calls": calls}

    async def _completion_turn(self, record: TrajectoryRecord, body: dict) -> dict:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
            raise RequestError(400, "'prompt' must be one string or one list of token ids")
        if record.builder is not None:
            raise RequestError(400, "this trajectory uses /v1/chat/completions; one trajectory uses one endpoint")
        track = record.track
        as_text = isinstance(prompt, str)
        if track is not None and as_text and track.text is not None and prompt.startswith(track.text):
            added = encode(self.tokenizer, prompt[len(track.text):])
        elif track is not None and not as_text and prompt[: len(track.ids)] == track.ids:
            added = list(prompt[len(track.ids):])
        else:
            if track is not None:
                record.history_resets += 1
            ids = encode(self.tokenizer, prompt) if as_text else list(prompt)
            track = record.track = CompletionTrack(ids, prompt if as_text else None)
            added = []
        budget = self.response_length - len(track.response_ids) - len(added)
        if added and budget <= 0:
            return {"ids": [], "logprobs": [], "finish": "length", "text": ""}
        _extend(track, added, 0, None)
        out = await self._sample(record, track.ids, budget, body)
        _extend(track, out["ids"], 1, out["logprobs"])
        text = decode(self.tokenizer, out["ids"], skip_special_tokens=True)
        track.text = prompt + text if as_text else None
        return {**out, "text": text}

    # --- output ------------------------------------------------------------------------------------------
    async def _stream(self, request: Any, kind: str, result: dict, include_usage: bool) -> Any:
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for chunk in _chunks(kind, result, self.tokenizer, include_usage):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def trajectory(self, record: TrajectoryRecord, sanity_check_mode: str = "disable") -> AgentLoopOutput | None:
        """The record as an agent-loop output (None when the model was never called)."""
        if not record.turns:
            return None
        if record.builder is not None:
            tokens = record.builder.result(sanity_check_mode)
            prompt_ids, response_ids = tokens.prompt_ids, tokens.response_ids
            mask, logprobs, truncated = tokens.response_mask, tokens.response_logprobs, tokens.truncated
        else:
            track = record.track
            prompt_ids, response_ids, mask = track.prompt_ids, track.response_ids, track.response_mask
            logprobs, truncated = track.logprobs, len(track.response_ids) >= self.response_length
        turns = len(record.turns)
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids), response_ids=list(response_ids), response_mask=list(mask),
            response_logprobs=None if logprobs is None else list(logprobs), num_turns=1 + 2 * turns - 1,
            metrics={"assistant_turns": float(turns), "truncated": float(truncated),
                     "history_resets": float(record.history_resets), "request_errors": float(record.errors)},
        )


def _extend(track: CompletionTrack, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None) -> None:
    track.response_ids += list(ids)
    track.response_mask += [mask] * len(ids)
    if track.logprobs is not None and (mask == 0 or logprobs is not None):
        track.logprobs += [float(x) for x in logprobs] if mask else [0.0] * len(ids)
    else:
        track.logprobs = None


def _plain_message(message: Any) -> dict:
    if not isinstance(message, dict) or "role" not in message:
        raise RequestError(400, f"each message needs a 'role': got {str(message)[:80]!r}")
    content = message.get("content")
    if isinstance(content, list):  # content parts: the text ones, joined
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return {**message, "content": content or ""}


def _continues(recorded: list[dict], messages: list[dict]) -> bool:
    """`messages` is the recorded conversation plus new messages: same roles, same non-assistant contents
    (the assistant turns are the server's own; the agent may resend them reformatted, e.g. with tool_calls)."""
    if len(messages) <= len(recorded):
        return False
    for old, new in zip(recorded, messages):
        if old["role"] != new["role"] or (old["role"] != "assistant" and old["content"] != new["content"]):
            return False
    return True


def _usage(result: dict, prompt_tokens: int = 0) -> dict:
    n = len(result["ids"])
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}


def _logprobs(kind: str, result: dict, tokenizer: Any) -> dict | None:
    if result["logprobs"] is None:
        return None
    tokens = [decode(tokenizer, [t], False) for t in result["ids"]]
    if kind == "chat.completion":
        return {"content": [{"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                            for s, lp in zip(tokens, result["logprobs"])]}
    return {"tokens": tokens, "token_logprobs": list(result["logprobs"]), "top_logprobs": None, "text_offset": None}


def _response(kind: str, result: dict, with_logprobs: bool, tokenizer: Any) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": result["finish"], "logprobs": None,
                              "token_ids": result["ids"]}
    if kind == "chat.completion":
        message: dict[str, Any] = {"role": "assistant", "content": result["text"]}
        if result.get("calls"):
            message["tool_calls"] = result["calls"]
        choice["message"] = message
    else:
        choice["text"] = result["text"]
    if with_logprobs:
        choice["logprobs"] = _logprobs(kind, result, tokenizer)
    return {"id": f"rlpost-{uuid.uuid4().hex[:16]}", "object": kind, "created": int(time.time()),
            "model": MODEL_NAME, "choices": [choice], "usage": _usage(result)}


def _chunks(kind: str, result: dict, tokenizer: Any, include_usage: bool) -> list[dict]:
    """Server-sent chunks of a finished turn: one text delta per token (decoded incrementally, so multi-byte
    characters arrive whole), the tool calls, then the finish reason."""
    head = {"id": f"rlpost-{uuid.uuid4().hex[:16]}", "created": int(time.time()), "model": MODEL_NAME,
            "object": "chat.completion.chunk" if kind == "chat.completion" else "text_completion"}
    pieces, shown = [], ""
    if result.get("calls"):
        pieces = [result["text"]] if result["text"] else []
    else:
        for i in range(1, len(result["ids"]) + 1):
            text = decode(tokenizer, result["ids"][:i], skip_special_tokens=True)
            if not text.endswith("\ufffd") and text != shown:
                pieces.append(text[len(shown):])
                shown = text
        if shown != result["text"] and result["text"].startswith(shown):
            pieces.append(result["text"][len(shown):])

    def chunk(delta: dict | str, finish: str | None) -> dict:
        if kind == "chat.completion":
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        return {**head, "choices": [{"index": 0, "text": delta, "finish_reason": finish, "logprobs": None}]}

    chat = kind == "chat.completion"
    out = [chunk({"role": "assistant", "content": ""}, None)] if chat else []
    out += [chunk({"content": p} if chat else p, None) for p in pieces]
    if chat and result.get("calls"):
        out.append(chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(result["calls"])]}, None))
    out.append(chunk({} if chat else "", result["finish"]))
    if include_usage:
        out.append({**head, "choices": [], "usage": _usage(result)})
    return out
