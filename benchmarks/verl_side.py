"""verl's current release in a side environment on the GPU host, at its recommended settings, on the same workload.

    python -m benchmarks.verl_side fetch --out carry/verl_side         # here: the wheels the host lacks (~20 MB)
    python3 -m benchmarks.verl_side run --wheels carry/verl_side --model-dir /tmp/m_0.5b --steps 5   # GPU host

`fetch` downloads (pip, cp312 manylinux, no dependencies) `VERL_SIDE`: verl 0.9.1 (its newest release; the
mirror's source is an older 0.8.0.dev snapshot) and the pins where it differs from the GPU host and the rlpost
bundle (it wants transformers < 5.11 and tensordict <= 0.10; the host has 5.17, the bundle 0.15.3), plus what
its default v1 trainer imports that neither has (TransferQueue, orjson). verl 0.9.1's own `vllm` extra pins
vllm==0.24.0, the bundle's vLLM (`benchmarks/verl_c3.py` notes the API check).
`run` installs them into their own folder, put on PYTHONPATH in front of the rlpost bundle (vLLM, Ray,
Hydra), behind `benchmarks/verl_caps` (its `sitecustomize` gives each rollout request its sample's cap from
`extra_info.response_caps`, rlpost's rule), writes the GSM8K-shaped workload as parquet unless `--data` holds
it, and runs `verl.trainer.main_ppo` with the settings of verl's own GRPO example
(`examples/grpo_trainer/run_qwen2-7b_seq_balance.sh`: dynamic batch size with 24000 tokens per GPU, gradient
checkpointing, low-variance KL loss 0.001, rollout memory 0.6, the reference's parameters offloaded) scaled to
one GPU and 64 x 8.

Three differences from that example:
- packing off (`use_remove_padding=False`) with SDPA attention (forced): verl 0.9.1 packs through flash-attn's
  varlen kernel; without flash-attn (absent on the host) a flash_attention_2 model does not load, and SDPA or
  eager attention over a packed row let each sequence attend to the ones before it (`attention_check`, run on
  CPU: max |packed - separate| logit difference 0.8 under transformers 5.10 and 5.19; flex attention too).
  verl's model engine then pads each micro-batch to its own longest row (dynamic batch size balances tokens).
- `rollout.ignore_eos=True` and the per-sample caps (for the same work): a random-weight model never stops by
  itself, and verl has no per-sample cap of its own; rlpost's run sets the same `ignore_eos`.
- vLLM, not SGLang (the example's default; the bundle carries vLLM), and 64 x 8 on one GPU (rollout TP 1).
Writes `<session>/verl.json` with verl's per-step times (steps 2..N), its metrics file `verl_metrics.jsonl` and
its log `verl_stdout.log`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

VERL_SIDE = ["verl==0.9.1", "transformers==5.10.2", "tokenizers==0.22.2", "tensordict==0.10.0", "torchdata==0.11.0",
             "datasets==4.0.0", "multiprocess==0.70.16", "dill==0.3.8", "pylatexenc==2.10", "transferqueue==0.1.11",
             "orjson==3.13.0"]
CAPS_DIR = Path(__file__).resolve().parent / "verl_caps"  # the sitecustomize of the per-sample caps
SDIST_ONLY = {"pylatexenc==2.10"}  # built into a pure-Python wheel here


def fetch(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for pin in VERL_SIDE:
        if pin in SDIST_ONLY:
            cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), pin]
        else:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                   "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
                   "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(out), pin]
        subprocess.run(cmd, check=True)


def attention_check() -> dict[str, str]:
    """Packed row (position ids restart per sequence, no mask: verl's packed call) against each sequence alone."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256,
                      num_hidden_layers=2, vocab_size=300)
    out = {}
    for impl in ("sdpa", "eager", "flash_attention_2"):
        torch.manual_seed(0)
        try:
            model = Qwen2ForCausalLM._from_config(cfg, attn_implementation=impl).eval()
        except ImportError as exc:
            out[impl] = f"does not load: {str(exc)[:80]}"
            continue
        a, b = torch.randint(0, 300, (1, 7)), torch.randint(0, 300, (1, 5))
        with torch.no_grad():
            alone = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits], dim=1)
            pos = torch.cat([torch.arange(7), torch.arange(5)])[None]
            packed = model(input_ids=torch.cat([a, b], 1), position_ids=pos, attention_mask=None).logits
        out[impl] = f"max |packed - separate| = {(packed - alone).abs().max().item():.2e}"
    return out


def verl_command(model_dir: Path, data: Path, steps: int, prompt_len: int, cap: int, prompts: int, n: int
                 ) -> list[str]:
    """`verl.trainer.main_ppo` at run_qwen2-7b_seq_balance.sh's settings, scaled to one GPU and `prompts` x `n`."""
    arr = "actor_rollout_ref"
    return [sys.executable, "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
            f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}",
            f"data.train_batch_size={prompts}", f"data.max_prompt_length={prompt_len}",
            f"data.max_response_length={cap}", "data.filter_overlong_prompts=True", "data.truncation=error",
            "data.shuffle=False", f"{arr}.model.path={model_dir}", f"{arr}.actor.optim.lr=1e-6",
            f"{arr}.model.use_remove_padding=False", f"+{arr}.model.override_config.attn_implementation=sdpa",
            f"{arr}.actor.ppo_mini_batch_size={prompts}", f"{arr}.actor.use_dynamic_bsz=True",
            # the 7B script's 24000 tokens per micro-batch counts real tokens; padded, a micro-batch holds rows of
            # the longest length: at 24000 verl's log-prob entropy over fp32 logits asked for 42 GiB and ran out
            # of memory on an H200 (2026-12-03c); VERL_MAX_TOKEN_LEN=8192 ran
            f"{arr}.actor.ppo_max_token_len_per_gpu={os.environ.get('VERL_MAX_TOKEN_LEN', 8192)}",
            f"{arr}.actor.use_kl_loss=True",
            f"{arr}.actor.kl_loss_coef=0.001", f"{arr}.actor.kl_loss_type=low_var_kl", f"{arr}.actor.entropy_coeff=0",
            f"{arr}.model.enable_gradient_checkpointing=True", f"{arr}.actor.fsdp_config.param_offload=False",
            f"{arr}.actor.fsdp_config.optimizer_offload=False", f"{arr}.rollout.tensor_model_parallel_size=1",
            f"{arr}.rollout.name=vllm", f"{arr}.rollout.mode=async", f"{arr}.rollout.gpu_memory_utilization=0.6",
            f"{arr}.rollout.n={n}", f"{arr}.rollout.enforce_eager=False", f"{arr}.rollout.ignore_eos=True",
            f"{arr}.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
            "trainer.critic_warmup=0", "trainer.logger=[console,file]", "trainer.project_name=verl_c3",
            "trainer.experiment_name=grpo_0.5b", "trainer.val_before_train=False", "trainer.n_gpus_per_node=1",
            "trainer.nnodes=1", "trainer.save_freq=-1", "trainer.test_freq=-1",
            f"trainer.total_training_steps={steps}"]


def side_env(site: Path, metrics: Path) -> dict[str, str]:
    """The verl run's environment: the caps patch, then the side folder, in front of what PYTHONPATH held."""
    rest = os.environ.get("PYTHONPATH", "")
    # vLLM's own default (engine core in its own process), which verl's async server is built on; rlpost's
    # commands export 0 (its engine lives in the worker)
    return {"PYTHONPATH": f"{CAPS_DIR}:{site}" + (f":{rest}" if rest else ""), "PYTHONUNBUFFERED": "1",
            "VERL_FILE_LOGGER_PATH": str(metrics), "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


def write_data(args: argparse.Namespace) -> None:
    """The workload's parquet (every step's prompts in file order, and one step as validation) into args.data."""
    from transformers import AutoTokenizer

    from benchmarks import workload

    wl = workload.gsm8k_shaped(args.prompts * args.steps, args.n, args.cap, args.seed)
    tok = AutoTokenizer.from_pretrained(str(args.model_dir))
    workload.write_parquet(wl, tok, args.data / "train.parquet", args.seed)
    workload.write_parquet(wl.step(0, args.prompts), tok, args.data / "val.parquet", args.seed)


def run(args: argparse.Namespace) -> None:
    from benchmarks import harness, main_ppo_runs, verl_c3

    start = time.monotonic()  # the install and the parquet count against --timeout too
    site = Path("/tmp/verl_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *map(str, sorted(args.wheels.glob("*.whl")))], check=True)
    if not (args.data / "train.parquet").exists():
        write_data(args)
    out = args.session or harness.session_dir(harness.RESULTS, harness.environment())
    run_dir = Path("/tmp/verl_run")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    cmd = verl_command(args.model_dir, args.data, args.steps, args.prompt_len, args.cap, args.prompts, args.n)
    env = side_env(site, run_dir / "metrics.jsonl")
    out.mkdir(parents=True, exist_ok=True)
    left = max(30, int(args.timeout - (time.monotonic() - start)))
    got = main_ppo_runs.launch(cmd, env, run_dir, out / "verl_stdout.log", "verl", timeout_s=left)
    (out / "verl_metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text()
                                            if (run_dir / "metrics.jsonl").exists() else "")
    rows = verl_c3.verl_rows(out / "verl_metrics.jsonl", out / "verl_stdout.log")
    steps = [r["timing_s/step"] for r in rows]
    res = harness.Result("verl", " ".join(cmd), max(len(steps) - 1, 0))
    if len(steps) > 1:
        res.timing("verl_step_s", steps[1:], all_steps=steps)
    res.extra.update(returncode=got.rc, timed_out=got.timed_out, wall_s=got.wall_s, rows=rows,
                     caps_patched=verl_c3.caps_patched((out / "verl_stdout.log").read_text(errors="replace")))
    print(f"[verl_side] steps {steps} rc {got.rc} -> {res.write(session=out)}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks import workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("fetch").add_argument("--out", type=Path, required=True)
    sub.add_parser("check", help="the attention check on this machine's transformers")
    r = sub.add_parser("run")
    workload.add_arguments(r)
    r.add_argument("--wheels", type=Path, required=True)
    r.add_argument("--steps", type=int, default=5)
    r.add_argument("--prompt-len", type=int, default=192)
    r.add_argument("--data", type=Path, default=Path("/tmp/verl_data"), help="the workload's parquet folder "
                   "(written there unless it holds train.parquet)")
    r.add_argument("--timeout", type=int, default=540, help="seconds before the run is killed (it keeps its steps)")
    r.add_argument("--session", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.what == "fetch":
        fetch(args.out)
    elif args.what == "check":
        print(attention_check())
    else:
        run(args)


if __name__ == "__main__":
    main()
