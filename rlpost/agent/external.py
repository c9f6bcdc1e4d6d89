"""`external_agent`: each row runs a program of yours (a command, or a Python callable) that talks to the model
through the OpenAI-compatible endpoint of `rlpost.agent.openai_server`; the server's record of its calls is the
trajectory.

    # agent.agent_loop_config_path
    - name: my_cli_agent
      _target_: rlpost.agent.external.ExternalAgentLoop
      command: python my_agent.py          # or a list; or  callable: my_pkg.agents:solve
      timeout_s: 60                        # seconds per row, then the program is killed
      reward: program                      # or reward_fn (the trainer's reward function scores the text)

A command runs in its own process group with, in its environment: `OPENAI_BASE_URL` (this trajectory's
`http://127.0.0.1:<port>/t/<id>/v1`), `OPENAI_API_KEY`, `OPENAI_MODEL`, `RLPOST_TRAJECTORY_ID`, `RLPOST_ROW_FILE`
(a JSON file: the row's `messages`, `extra_info`, `data_source`, `reward_model`, ...) and `RLPOST_REWARD_FILE`.
A callable is called as `fn(row=..., base_url=..., api_key=...)` (a plain function runs in a thread, a
coroutine function on the loop). With `reward: program` the reward is the JSON number or `{"reward": x}` written
to `RLPOST_REWARD_FILE`, else the last stdout line `{"reward": x}`, else what the callable returned.

Every row ends with one outcome, counted in `multi_turn/program/<outcome>` (beside the batch's totals
`multi_turn/program/history_resets` and `request_errors`): `ok`, `crashed` (non-zero exit or an exception),
`timeout` (killed after `timeout_s`), `no_model_call` (never called the endpoint; its row trains on nothing: one
masked EOS token) or `no_reward` (`reward: program` but none reported). A failed row scores `failure_reward` with
`reward: program`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import shlex
import signal
import tempfile
from typing import Any

from rlpost.agent.base import AgentLoopBase, AgentLoopOutput, register
from rlpost.agent.openai_server import MODEL_NAME, OpenAIServer
from rlpost.agent.samples import prompt_messages
from rlpost.agent.trajectory import encode, render

OUTCOMES = ("ok", "crashed", "timeout", "no_model_call", "no_reward")
REWARD_SOURCES = ("reward_fn", "program")
SERVICE = "openai_server"  # key of the shared server in AgentLoopContext.services


def _import_callable(path: str) -> Any:
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"callable={path!r}: write it as 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module), name, None)
    except ImportError as err:
        raise ValueError(f"callable={path!r}: cannot import {module}: {err}") from err
    if not callable(fn):
        raise ValueError(f"callable={path!r}: {module} has no function {name!r}")
    return fn


def _check(command: Any, callable_: str | None, timeout_s: Any, reward: str) -> list[str] | None:
    """The command as argv (None with a callable). Raises ValueError naming the option and a value that works."""
    if (command is None) == (callable_ is None):
        raise ValueError("set exactly one of 'command' (e.g. command: python agent.py) and 'callable' "
                         "(e.g. callable: my_pkg.agents:solve)")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r}: must be a number of seconds > 0, e.g. timeout_s: 60")
    if reward not in REWARD_SOURCES:
        raise ValueError(f"reward={reward!r}: must be one of {list(REWARD_SOURCES)}")
    if callable_ is not None:
        _import_callable(callable_)
        return None
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command or []]
    if not argv:
        raise ValueError(f"command={command!r}: give the program to run, e.g. command: python agent.py")
    return argv


def _json_row(sample: dict[str, Any]) -> dict[str, Any]:
    """The row's JSON-able fields for the program (others are dropped)."""
    row = {}
    for key, value in sample.items():
        try:
            row[key] = json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
        except (TypeError, ValueError):
            continue
    return row


def _reported_reward(reward_file: str, stdout: str, returned: Any) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        with open(reward_file) as f:
            text = f.read().strip()
        if text:
            value = json.loads(text)
            return float(value["reward"] if isinstance(value, dict) else value)
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                return float(json.loads(line)["reward"])
    if isinstance(returned, dict) and "reward" in returned:
        return float(returned["reward"])
    if isinstance(returned, (int, float)) and not isinstance(returned, bool):
        return float(returned)
    return None


async def _kill(proc: Any) -> None:
    """SIGKILL the program's process group (its children too) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await proc.wait()


@register("external_agent")
class ExternalAgentLoop(AgentLoopBase):
    """Runs the configured program per row against the endpoint (see the module docstring).

    Keyword args (the loop's entry in `agent.agent_loop_config_path`):
        command: str or list, the program; or callable: 'module:function'.
        timeout_s: seconds per row (default 60).
        reward: `reward_fn` (default) or `program`.
        failure_reward: score of a failed row with `reward: program` (default 0.0).
        env: extra environment variables of the command.
    """

    def __init__(self, context: Any, command: Any = None, callable: str | None = None,  # noqa: A002
                 timeout_s: float = 60.0, reward: str = "reward_fn", failure_reward: float = 0.0,
                 env: dict | None = None, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.argv = _check(command, callable, timeout_s, reward)
        self.fn = None if callable is None else _import_callable(callable)
        self.timeout_s, self.reward, self.failure_reward = float(timeout_s), reward, float(failure_reward)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}

    @classmethod
    def check_options(cls, command: Any = None, callable: str | None = None, timeout_s: float = 60.0,  # noqa: A002
                      reward: str = "reward_fn", failure_reward: float = 0.0, env: dict | None = None) -> None:
        """Start-up check of the YAML entry's options (raises ValueError; unknown options raise TypeError)."""
        _check(command, callable, timeout_s, reward)

    async def _server(self, sampling_params: dict[str, Any]) -> OpenAIServer:
        """The endpoint shared by every row of this call (started by the first row, closed by the runner)."""
        services = self.context.services
        if SERVICE not in services:
            server = OpenAIServer(self.context.generate, self.tokenizer, sampling_params, self.config.response_length,
                                  self.config.format, self.config.template_kwargs)
            services[SERVICE] = server
            server.ready = asyncio.ensure_future(server.start())  # the other rows wait on the same start
        server = services[SERVICE]
        await asyncio.shield(server.ready)
        return server

    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        server = await self._server(sampling_params)
        tid = server.open()
        with tempfile.TemporaryDirectory(prefix="rlpost_agent_") as tmp:
            row_file, reward_file = os.path.join(tmp, "row.json"), os.path.join(tmp, "reward.json")
            row = {"trajectory_id": tid, "messages": prompt_messages(sample, "external_agent"), **_json_row(sample)}
            with open(row_file, "w") as f:
                json.dump(row, f)
            env = {"OPENAI_BASE_URL": server.base_url(tid), "OPENAI_API_KEY": f"rlpost-{tid}",
                   "OPENAI_MODEL": MODEL_NAME, "RLPOST_TRAJECTORY_ID": tid, "RLPOST_ROW_FILE": row_file,
                   "RLPOST_REWARD_FILE": reward_file}
            try:
                outcome, stdout, returned = await self._launch(env, row, server.base_url(tid))
            finally:
                record = server.close(tid)
            reward = _reported_reward(reward_file, stdout, returned) if self.reward == "program" else None
        output = server.trajectory(record, self.config.tokenization_sanity_check_mode)
        if output is None:
            outcome = "no_model_call" if outcome == "ok" else outcome
            output = self._empty(sample)
        if outcome == "ok" and self.reward == "program" and reward is None:
            outcome = "no_reward"
        if self.reward == "program":
            output.reward_score = reward if outcome == "ok" else self.failure_reward
        output.metrics.update({f"program_{o}": float(o == outcome) for o in OUTCOMES})
        for key in ("history_resets", "request_errors"):  # summed per step as multi_turn/program/<key>
            output.metrics[f"program_{key}"] = output.metrics.pop(key, 0.0)
        output.extra_fields["program_outcome"] = outcome
        return output

    async def _launch(self, env: dict[str, str], row: dict, base_url: str) -> tuple[str, str, Any]:
        """(outcome, the command's stdout, what the callable returned) after at most `timeout_s` seconds."""
        if self.fn is not None:
            kwargs = {"row": row, "base_url": base_url, "api_key": env["OPENAI_API_KEY"]}
            # a plain function runs in a thread: its blocking HTTP calls must not stop the loop serving them
            call = self.fn(**kwargs) if asyncio.iscoroutinefunction(self.fn) else asyncio.to_thread(self.fn, **kwargs)
            try:
                return "ok", "", await asyncio.wait_for(call, self.timeout_s)
            except asyncio.TimeoutError:
                return "timeout", "", None
            except Exception:
                return "crashed", "", None
        proc = await asyncio.create_subprocess_exec(
            *self.argv, env={**os.environ, **self.env, **env}, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            stdout, _ = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except asyncio.TimeoutError:
            await _kill(proc)
            return "timeout", "", None
        except asyncio.CancelledError:  # the step is stopping: no program outlives it
            await _kill(proc)
            raise
        return ("ok" if proc.returncode == 0 else "crashed"), stdout.decode(errors="replace"), None

    def _empty(self, sample: dict[str, Any]) -> AgentLoopOutput:
        """A row the model never answered: the rendered prompt and one EOS token with mask 0 (nothing trains)."""
        messages = prompt_messages(sample, "external_agent")
        text = render(self.tokenizer, messages, None, True, self.config.template_kwargs)
        return AgentLoopOutput(prompt_ids=encode(self.tokenizer, text), response_ids=[self.tokenizer.eos_token_id],
                               response_mask=[0], response_logprobs=[0.0], num_turns=1, metrics={})
