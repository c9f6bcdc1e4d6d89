"""Rollout generation tokens/s per vLLM engine setting (issue 48 goal A4: the best setting >= 1.5x today's).

    python -m benchmarks.bench_gen_knobs --model-dir /tmp/m_0.5b --rounds 12 --budget-s 300   # one GPU
    python -m benchmarks.bench_gen_knobs --toy                                                  # CPU smoke, < 60 s

Each configuration is rlpost's own engine: `rlpost.rollout.vllm.engine_kwargs` and `engine_env` of the packaged
config with the GPU example's rollout keys (`EXAMPLE_ROLLOUT`: examples/common.sh at its 512 + 1024 lengths, the
memory share set by `--gpu-memory-utilization`), plus the configuration's own overrides (`CANDIDATES`; "a+b" merges
two). Every engine lives in its own subprocess, started one after the other and kept alive: on GPU it sleeps at
level 1 (weights to host memory, KV cache dropped) between its turns, so the engines share one GPU with a small
memory share each. The workload is `benchmarks.workload`'s GSM8K-shaped batch (`--prompts` x `--n`, long-tailed
per-sample caps up to `--cap`), one request per sample with rlpost's own `sampling_params` (ignore_eos: every
sample ends at its cap, so all configurations generate the same tokens).

Rounds alternate the configurations' order (`harness.alternate`, reversed every other round); the parent's CPU
probe runs before each turn and each engine's process times its own just before generating. Per configuration:
generated tokens/s (wake and sleep outside the timed generation, reported beside it) and the paired ratio
tokens/s config / baseline over the rounds (geometric mean, 95 % Student-t interval). Goal A4 is the best
configuration's ratio. `--budget-s` bounds the whole run, engine starts included: rounds stop once the next one
would not fit, and the result says how many ran.
Writes `benchmarks/results/<date>_<gpu|cpu>/gen_knobs.json` (or `--json-out`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402

ARR = "actor_rollout_ref.rollout"
EXAMPLE_ROLLOUT = (  # examples/common.sh's rollout keys; the memory share comes from --gpu-memory-utilization
    f"{ARR}.name=vllm", f"{ARR}.enforce_eager=false", f"{ARR}.max_num_batched_tokens=16384",
    f"{ARR}.tensor_model_parallel_size=1", "data.max_prompt_length=512", "data.max_response_length=1024",
)
# name -> (Hydra overrides on top of EXAMPLE_ROLLOUT, what the setting does in vLLM 0.24)
CANDIDATES: dict[str, tuple[tuple[str, ...], str]] = {
    "baseline": ((), "today's rlpost engine (the GPU example's rollout keys)"),
    "async_off": ((f"++{ARR}.engine_kwargs.vllm.async_scheduling=false",),
                  "control: vLLM 0.24 already overlaps scheduling with the GPU by default (in-process TP=1)"),
    "runner_v2": ((f"{ARR}.model_runner=v2",), "Model Runner V2 (inputs prepared on the GPU); V1 is the default "
                                                "for Qwen2 in vLLM 0.24"),
    "seqs_512": ((f"{ARR}.max_num_seqs=512",), "max_num_seqs = the batch's 512 samples (1024 today)"),
    "tokens_64k": ((f"{ARR}.max_num_batched_tokens=65536",), "the whole prefill in one or two scheduler steps"),
    "no_prefix_cache": ((f"{ARR}.enable_prefix_caching=false",), "no block hashing per step"),
    "capture_1024": ((f"{ARR}.cudagraph_capture_sizes=[1,2,4,8,16,32,64,96,128,192,256,320,384,448,512,640,768,"
                      "896,1024]",), "CUDA graphs up to 1024 tokens (default: 512), mixed prefill steps too"),
}
# 3 engines x 12 rounds fit 300 s on one H200 (~35 s per engine start, ~4.5 s per generation); the other
# candidates go in a second run (`--configs async_off seqs_512 tokens_64k`, the baseline comes with every run)
DEFAULT_CONFIGS = ("baseline", "runner_v2", "runner_v2+tokens_64k")
TOY_CONFIGS = ("baseline", "no_prefix_cache")
A4_TARGET = ">= 1.5"


def build_configs(specs: list[str]) -> dict[str, tuple[str, ...]]:
    """{spec: its overrides} for each spec, a candidate's name or names joined by "+" (overrides merged in order).
    The baseline comes first (added when missing); a repeated spec or an unknown name is refused."""
    specs = ["baseline", *[s for s in specs if s != "baseline"]]
    if len(set(specs)) != len(specs):
        raise ValueError(f"--configs: a configuration is named twice in {specs}")
    out = {}
    for spec in specs:
        names = spec.split("+")
        unknown = [n for n in names if n not in CANDIDATES]
        if unknown:
            raise ValueError(f"--configs: unknown setting(s) {unknown} in {spec!r}; known: {', '.join(CANDIDATES)}")
        out[spec] = tuple(o for n in names for o in CANDIDATES[n][0])
    return out


def rlpost_engine(model_dir: Path, overrides: tuple[str, ...], device: str, share: float
                  ) -> tuple[dict[str, Any], dict[str, str], Any]:
    """(vllm.LLM kwargs, engine environment, typed rollout config) of rlpost's rollout for the packaged config +
    the example's rollout keys + `overrides`."""
    from hydra import compose, initialize_config_module

    from rlpost.rollout.vllm import engine_env, engine_kwargs
    from rlpost.trainer.config import typed_config

    over = [*EXAMPLE_ROLLOUT, f"{ARR}.gpu_memory_utilization={share}", f"trainer.device={device}",
            f"actor_rollout_ref.model.path={model_dir}", *overrides]
    if device != "cuda":
        over.append(f"{ARR}.enforce_eager=true")
    with initialize_config_module("rlpost.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=over)
    rollout = typed_config(cfg).actor_rollout_ref.rollout
    return engine_kwargs(rollout, str(model_dir), device), engine_env(rollout, device), rollout


def requests_and_params(args: argparse.Namespace, rollout: Any) -> tuple[list[dict[str, Any]], list[Any], int]:
    """The workload's requests (one per sample, prompt-major) with rlpost's `sampling_params` at each sample's cap,
    and the tokens they must generate."""
    from rlpost.rollout.base import resolve_sampling
    from rlpost.rollout.vllm import sampling_params

    from benchmarks import workload

    wl = workload.gsm8k_shaped(args.prompts, args.n, args.cap, args.seed)
    prompts = workload.token_prompts(wl, args.vocab, args.seed)
    spec = replace(resolve_sampling(rollout, {}), ignore_eos=True, logprobs=args.logprobs)
    rows = wl.rows()
    requests = [{"prompt_token_ids": prompts[i // args.n]} for i in range(len(rows))]
    params = [sampling_params(replace(spec, max_tokens=cap), set()) for _, cap in rows]
    return requests, params, sum(cap for _, cap in rows)


def serve(args: argparse.Namespace) -> None:
    """One configuration's engine: build, warm up, sleep; then per `gen` line wake, generate (timed), sleep."""
    import torch

    from rlpost.rollout.vllm import apply_engine_env

    device = "cuda" if torch.cuda.is_available() else "cpu"
    overrides = tuple(json.loads(args.serve_overrides))
    try:
        kwargs, env, rollout = rlpost_engine(args.model_dir, overrides, device, args.gpu_memory_utilization)
        apply_engine_env(env)
        from vllm import LLM

        start_s, llm = harness.timed(lambda: LLM(**kwargs))
    except Exception as exc:  # noqa: BLE001 - a setting this vLLM refuses is a result, not a crash of the run
        harness.reply({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    requests, params, expected = requests_and_params(args, rollout)
    sync = torch.cuda.synchronize if device == "cuda" else None
    sleeps = device == "cuda" and bool(kwargs.get("enable_sleep_mode"))

    def generate() -> dict[str, Any]:
        wake_s = harness.timed(llm.wake_up, sync)[0] if sleeps else 0.0
        probe = harness.cpu_probe_ms()
        seconds, outs = harness.timed(lambda: llm.generate(requests, params, use_tqdm=False), sync)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        if tokens != expected:
            raise RuntimeError(f"generated {tokens} tokens, the caps ask {expected}: the engine did not honour them")
        if sleeps:  # a level-1 sleep also clears the prefix cache: the next round's prompts start cold
            sleep_s = harness.timed(lambda: llm.sleep(level=1), sync)[0]
        else:
            sleep_s = harness.timed(llm.reset_prefix_cache)[0]
        return {"s": seconds, "tokens": tokens, "tok_s": tokens / seconds, "wake_s": wake_s, "sleep_s": sleep_s,
                "engine_probe_ms": probe}

    generate()  # warm-up: fills the allocator, the first request shapes
    harness.reply({"ready": True, "start_s": start_s, "env": env, "overrides": list(overrides),
                   "kwargs": {k: v for k, v in kwargs.items() if k != "model"}})
    for line in sys.stdin:
        if line.strip() != "gen":
            break
        harness.reply(generate())


class Engine:
    """A configuration's serving process (`--serve`), replying one line per request."""

    def __init__(self, name: str, overrides: tuple[str, ...], args: argparse.Namespace) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", name, "--serve-overrides",
               json.dumps(list(overrides)), "--model-dir", str(args.model_dir), "--vocab", str(args.vocab),
               "--prompts", str(args.prompts), "--n", str(args.n), "--cap", str(args.cap), "--seed", str(args.seed),
               "--gpu-memory-utilization", str(args.gpu_memory_utilization)] + (["--logprobs"] if args.logprobs else [])
        self.name = name
        self.ready: dict[str, Any] = {}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                         [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)})

    def wait_ready(self) -> dict[str, Any]:
        """The process's first reply: started (with its start-up time and kwargs) or the error that stopped it."""
        self.ready = harness.read_reply(self.proc.stdout, sys.stdout, f"engine {self.name}")
        return self.ready

    def generate(self) -> dict[str, Any]:
        self.proc.stdin.write("gen\n")
        return harness.read_reply(self.proc.stdout, sys.stdout, f"engine {self.name}")

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def rounds_that_fit(elapsed_s: float, budget_s: float | None, round_s: float | None) -> bool:
    """Whether one more round of `round_s` seconds (the slowest so far; None before any) fits the budget."""
    if budget_s is None:
        return True
    return elapsed_s + (round_s or 0.0) <= budget_s


def summarize(rounds: list[dict[str, Any]], names: list[str], baseline: str = "baseline") -> dict[str, Any]:
    """Per configuration: tokens/s spread and the paired ratio config / baseline (geometric mean, 95 % interval)
    over the rounds; `best`: the configuration of the highest ratio other than the baseline (None without one)."""
    out: dict[str, Any] = {"configs": {}, "best": None}
    if not rounds:
        return out
    base = [r[baseline]["tok_s"] for r in rounds]
    for name in names:
        tok_s = [r[name]["tok_s"] for r in rounds]
        entry = {"tok_s": harness.spread(tok_s), "ratio": harness.paired_ratio(tok_s, base),
                 "wake_plus_sleep_s": harness.spread([r[name]["wake_s"] + r[name]["sleep_s"] for r in rounds])}
        out["configs"][name] = entry
    others = [n for n in names if n != baseline]
    if others:
        out["best"] = max(others, key=lambda n: out["configs"][n]["ratio"]["value"])
    return out


def build_result(args: argparse.Namespace, res: dict[str, Any], env: dict[str, Any]) -> harness.Result:
    """The harness result: a tokens/s timing metric and a ratio metric per configuration, goal A4 on the best."""
    rounds = res["rounds"]
    result = harness.Result("gen_knobs", harness.command_line(), len(rounds), env=env)
    names = [n for n, e in res["engines"].items() if e.get("ready")]
    summary = summarize(rounds, names)
    for name, entry in summary["configs"].items():
        result.timing(f"{name}_tok_s", [r[name]["tok_s"] for r in rounds], unit="tokens/s")
        ratio = entry["ratio"]
        result.metric(f"{name}_over_baseline", ratio["value"], ratio["ci_low"], ratio["ci_high"],
                      unit="tokens/s ratio", values=ratio["values"])
    best = summary["best"]
    short = len(rounds) < 12
    if best is None:
        result.not_measured("A4", A4_TARGET, "no configuration besides the baseline started")
    else:
        result.goal("A4", summary["configs"][best]["ratio"], A4_TARGET, config=best,
                    overrides=res["engines"][best]["overrides"],
                    **({"note": f"{len(rounds)} rounds (the issue's protocol asks >= 12)"} if short else {}))
    result.extra.update(settings=harness.params(args), summary=summary, engines=res["engines"], rounds=rounds,
                        budget_cut=res.get("budget_cut", False), wall_s=res.get("wall_s"))
    return result


def table(summary: dict[str, Any]) -> str:
    lines = [f"{'config':>28} {'tokens/s median [min, max]':>34} {'x baseline [95% CI]':>26}"]
    for name, e in summary["configs"].items():
        t, r = e["tok_s"], e["ratio"]
        ci = "" if r["ci_low"] is None else f" [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        lines.append(f"{name:>28} {t['median']:>14.0f} [{t['min']:.0f}, {t['max']:.0f}] {r['value']:>9.3f}{ci}")
    return "\n".join(lines + [f"best: {summary['best']}"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    configs = build_configs(args.configs)
    engines: dict[str, Engine] = {}
    res: dict[str, Any] = {"engines": {}, "rounds": []}
    env = harness.environment()
    # GPU: one start at a time (each engine sizes its memory from what is free, then sleeps); CPU: all at once
    together = env["gpu"] == "cpu"
    try:
        started = {name: Engine(name, overrides, args) for name, overrides in configs.items()} if together else {}
        for name, overrides in configs.items():
            engine = started[name] if together else Engine(name, overrides, args)
            res["engines"][name] = engine.wait_ready()
            ready = engine.ready
            print(f"[knobs] {name}: " + (f"started in {ready['start_s']:.1f} s" if ready["ready"] else ready["error"]),
                  flush=True)
            if engine.ready["ready"]:
                engines[name] = engine
            else:
                engine.close()
        if "baseline" not in engines:
            raise RuntimeError(f"the baseline engine did not start: {res['engines']['baseline'].get('error')}")
        print(f"[knobs] {len(engines)} engines up after {time.perf_counter() - t0:.0f} s", flush=True)
        slowest: float | None = None
        for r in range(args.rounds):
            if not rounds_that_fit(time.perf_counter() - t0, args.budget_s, slowest):
                res["budget_cut"] = True
                print(f"[knobs] --budget-s {args.budget_s}: stopping after {r} rounds", flush=True)
                break
            start = time.perf_counter()
            # one round of harness.alternate, its order that of round r (reversed on odd rounds)
            row = harness.alternate({n: engines[n].generate for n in harness.order(r, list(engines))}, rounds=1)[0]
            row["round"] = r
            res["rounds"].append(row)
            slowest = max(slowest or 0.0, time.perf_counter() - start)
            print(f"[knobs] round {r}: " + ", ".join(f"{n} {row[n]['tok_s']:.0f} tok/s" for n in engines), flush=True)
            res["wall_s"] = time.perf_counter() - t0
            build_result(args, res, env).write(path=args.json_out)  # a run cut short keeps its rounds
    finally:
        for engine in engines.values():
            engine.close()
    res["wall_s"] = time.perf_counter() - t0
    result = build_result(args, res, env)
    path = result.write(path=args.json_out)
    print(table(result.extra["summary"]))
    print(f"[knobs] A4 {json.dumps(result.goals['A4'], default=str)}")
    print(f"[knobs] wrote {path} in {res['wall_s']:.0f} s", flush=True)
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks import workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload.add_arguments(ap, model_dir=False)
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/m_0.5b"),
                    help="the model (a random-weight Qwen2.5-0.5B is built there when missing)")
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                    help=f"configurations: names of {', '.join(CANDIDATES)}, or several joined by '+'")
    ap.add_argument("--rounds", type=int, default=12, help="alternated rounds (the issue's protocol: >= 12)")
    ap.add_argument("--budget-s", type=float, default=None, help="wall-clock bound of the whole run, engine starts "
                    "included: no round starts that would end past it")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.12, help="each engine's memory share")
    ap.add_argument("--logprobs", action="store_true", help="ask each sample's log-probs (calculate_log_probs=true)")
    ap.add_argument("--toy", action="store_true", help="CPU smoke: a tiny model, 2 configs x 2 rounds, 8 x 2 samples")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--vocab", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--serve-overrides", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.toy and args.serve is None:
        args.configs, args.rounds, args.prompts, args.n, args.cap = list(TOY_CONFIGS), 2, 8, 2, 32
    return args


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    args = parse_args(argv)
    if args.serve is not None:
        return serve(args)
    build_configs(args.configs)  # refuse a bad --configs before any engine starts
    if args.toy:
        import tempfile

        from rlpost.utils.tiny_model import build_tiny_model

        from transformers import AutoConfig

        args.model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="gen_knobs_")) / "tiny")
        args.vocab = AutoConfig.from_pretrained(args.model_dir).vocab_size
        if args.json_out is None:
            args.json_out = Path(tempfile.gettempdir()) / "gen_knobs_toy.json"
    else:
        import bench_limits

        args.vocab = bench_limits.model_vocab(args.model_dir)  # builds the 0.5B model when missing
    run(args)


if __name__ == "__main__":
    main()
