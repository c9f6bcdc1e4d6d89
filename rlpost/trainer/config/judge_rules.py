"""Start-up rules of a generative reward model (`reward_model.judge`, `rlpost.reward.judge`): the parser and API
exist, the judge is either served by rlpost on a pool of its own or at a URL, and the pool fits the machine."""

from __future__ import annotations

import os
from typing import Any

from rlpost.config.schema import PPOTrainerConfig
from rlpost.reward.judge import APIS, PARSERS
from rlpost.trainer.config.distillation_rules import _weights
from rlpost.trainer.config.errors import warn
from rlpost.trainer.config.roles import generative_judge
from rlpost.trainer.config.rules import fail

J = "reward_model.judge"
POOL_FIX = "reward_model.enable_resource_pool=true reward_model.nnodes=1 reward_model.n_gpus_per_node=1"


def check_judge(c: PPOTrainerConfig) -> None:
    """The judge's own keys, then where it runs (`_check_served` / `_check_url`)."""
    rm, judge = c.reward_model, c.reward_model.judge
    if judge.parser not in PARSERS:
        fail(f"{J}.parser={judge.parser}", f"a verdict parser ({PARSERS.names()})", f"{J}.parser=last_number")
    if judge.api not in APIS:
        fail(f"{J}.api={judge.api}", f"the judge's API ({', '.join(APIS)})", f"{J}.api=chat")
    if not 0 < judge.top_p <= 1:
        fail(f"{J}.top_p={judge.top_p}", "a probability mass in (0, 1]", f"{J}.top_p=1.0")
    if judge.max_score is not None and judge.max_score <= 0:
        fail(f"{J}.max_score={judge.max_score}", "the top of the judge's scale is > 0", f"{J}.max_score=10.0")
    if judge.enable and not rm.enable:
        fail(f"{J}.enable=true, reward_model.enable=false", "the judge is the run's reward model",
             "reward_model.enable=true")
    _warn_unread(c)
    if not generative_judge(c):
        if rm.enable_resource_pool:
            fail("not supported yet: reward_model.enable_resource_pool=true without a generative reward model",
                 "a discriminative reward model runs beside the actor", "reward_model.enable_resource_pool=false "
                 f"(or a judge: reward_model.enable=true {J}.enable=true)")
        return
    if judge.enable and c.custom_reward_function.path:
        fail(f"{J}.enable=true, custom_reward_function.path={c.custom_reward_function.path}",
             "a response is scored either by the built-in judge scorer or by your function calling the judge",
             f"{J}.enable=false with reward_model.use_reward_loop=true (your function gets reward_router_address), "
             "or custom_reward_function.path=null")
    if rm.reward_kwargs:
        fail(f"not supported yet: reward_model.reward_kwargs={dict(rm.reward_kwargs)} with a generative reward "
             "model", f"the judge's requests are bounded by {J}.max_concurrency and {J}.timeout_s",
             "reward_model.reward_kwargs={}")
    manager = rm.reward_manager if c.reward.reward_manager.source == "register" else "importlib"
    if manager != "naive":
        fail(f"not supported yet: reward_model.reward_manager={manager} with a generative reward model",
             "the judge's samples are scored by the naive manager's reward loop", "reward_model.reward_manager=naive")
    if judge.url is None:
        _check_served(c)
    else:
        _check_url(c)


# The built-in scorer's keys: a custom reward function writes its own requests and reads its own verdicts.
SCORER_KEYS = ("api", "prompt_template", "system_prompt", "parser", "pattern", "json_key", "max_score",
               "failure_score", "max_tokens", "temperature", "top_p", "timeout_s")


def _warn_unread(c: PPOTrainerConfig) -> None:
    """One notice when `reward_model.judge.*` keys are set that this run does not read."""
    import dataclasses

    from rlpost.trainer.config.defaults import default_of

    judge = c.reward_model.judge
    changed = [f.name for f in dataclasses.fields(judge) if getattr(judge, f.name) != default_of(f"{J}.{f.name}")]
    if not generative_judge(c):
        unread = [k for k in changed if k != "enable"]
        why = "no generative reward model is used (reward_model.enable=true with reward_model.judge.enable=true)"
    elif not judge.enable:
        unread = [k for k in changed if k in SCORER_KEYS]
        why = (f"custom_reward_function {c.custom_reward_function.path} writes its own judge requests (the built-in "
               f"scorer, {J}.enable=true, reads them)")
    else:
        return
    if unread:
        warn(f"{', '.join(f'{J}.{k}' for k in unread)} set but not read: {why}")


def _check_served(c: PPOTrainerConfig) -> None:
    rm = c.reward_model
    if rm.rollout.name != "vllm":
        fix = "reward_model.rollout.name=vllm (or reward_model.judge.url=http://HOST:PORT/v1)"
        if rm.rollout.name is None:
            fail("reward_model.rollout.name=null with a generative reward model", "rlpost serves the judge with "
                 "vLLM unless reward_model.judge.url names a server", fix)
        fail(f"not supported yet: reward_model.rollout.name={rm.rollout.name} for the judge",
             "the judge's server runs vLLM", fix)
    if not rm.enable_resource_pool:
        fail("not supported yet: reward_model.enable_resource_pool=false with a generative reward model",
             "the judge runs on devices of its own (beside the actor, sleeping between uses, is not built)", POOL_FIX)
    if rm.nnodes < 1 or rm.n_gpus_per_node < 1:
        fail(f"reward_model.nnodes={rm.nnodes}, reward_model.n_gpus_per_node={rm.n_gpus_per_node}",
             "the judge's own pool needs at least one device", "reward_model.nnodes=1 reward_model.n_gpus_per_node=1")
    tp = rm.rollout.tensor_model_parallel_size
    if tp != 1:
        fail(f"not supported yet: reward_model.rollout.tensor_model_parallel_size={tp} for the judge",
             "each device of the judge's pool holds one whole engine",
             "reward_model.rollout.tensor_model_parallel_size=1")


def _check_url(c: PPOTrainerConfig) -> None:
    rm, judge = c.reward_model, c.reward_model.judge
    if not str(judge.url).startswith(("http://", "https://")):
        fail(f"{J}.url={judge.url}", "an OpenAI-compatible base URL", f"{J}.url=http://HOST:PORT/v1")
    if not judge.model_name:
        fail(f"{J}.url={judge.url}, {J}.model_name=null", "each request names the model that server serves",
             f"{J}.model_name=<the served model's name>")
    if rm.enable_resource_pool:
        fail(f"reward_model.enable_resource_pool=true, {J}.url={judge.url}",
             "a judge at a URL is served elsewhere and needs no pool here", "reward_model.enable_resource_pool=false")


def check_judge_devices(config: Any) -> None:
    """One node: the trainer's devices plus the judge's pool exist here (else Ray would wait for them)."""
    from rlpost.workers.judge_server import judge_devices

    judge, trainer = judge_devices(config), config.trainer
    if not judge or trainer.nnodes != 1 or config.reward_model.nnodes != 1:
        return
    rollout = config.actor_rollout_ref.rollout
    split = 0 if config.actor_rollout_ref.hybrid_engine else rollout.nnodes * rollout.n_gpus_per_node
    if trainer.device == "cuda":
        import torch

        have, kind = torch.cuda.device_count(), "CUDA device(s)"
    else:
        have, kind = config.ray_init.num_cpus or os.cpu_count() or 1, "CPU(s) for Ray (ray_init.num_cpus)"
    want = trainer.n_gpus_per_node + split + judge
    if want > have:
        raise ValueError(f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}"
                         + (f" + {split} rollout" if split else "")
                         + f" + reward_model.n_gpus_per_node={judge} judge = {want} devices, but this machine has "
                         f"{have} {kind}; use reward_model.n_gpus_per_node={max(have - want + judge, 1)}"
                         + ("" if have - want + judge >= 1 else f" and trainer.n_gpus_per_node={max(have - 1, 1)}"))


def judge_plan(c: PPOTrainerConfig) -> list[str]:
    """Dry-run lines: where the judge runs (its pool and weights per device) and how responses become scores."""
    if not generative_judge(c):
        return []
    rm, judge = c.reward_model, c.reward_model.judge
    if judge.url is None:
        devices = rm.nnodes * rm.n_gpus_per_node
        where = (f"judge pool: {devices} device(s) = reward_model.nnodes={rm.nnodes} x n_gpus_per_node="
                 f"{rm.n_gpus_per_node}, one vLLM engine of {rm.model.path} per device (OpenAI-compatible server)"
                 f"{_weights(rm.model.path, 1)}")
    else:
        where = f"judge: {judge.url} (model {judge.model_name}), served outside this run"
    fn = c.custom_reward_function
    how = (f"judge scorer: api={judge.api}, parser={judge.parser}, max_score={judge.max_score}, failure_score="
           f"{judge.failure_score}, max_tokens={judge.max_tokens}, temperature={judge.temperature}"
           if judge.enable else f"judge called by {fn.path}:{fn.name} (reward_router_address, verl's reward loop)")
    return [where, f"{how}; at most {judge.max_concurrency} requests in flight"]
