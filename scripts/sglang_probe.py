"""Check, step by step, that the SGLang bundle runs on this GPU host; print one line per step and a JSON summary.

    PYTHONPATH=/tmp/rlpost_sglang:/tmp/rlpost_site python scripts/sglang_probe.py [--engine MODEL_DIR]

Steps: versions (torch, transformers, sglang, sgl_kernel), the Hopper op library (`sgl_kernel` loads
`sm90/common_ops`), the memory saver's CUDA 13 hook, SGLang's engine modules, the CUDA compiler SGLang's
run-time kernels need (CUDA_HOME / nvcc, ninja, g++) and one such kernel built and run (SiLU-and-mul against
PyTorch). With `--engine MODEL_DIR` also a bare `sglang.Engine` (triton attention, PyTorch sampler, memory saver):
generate, release / resume memory, generate again. Every step runs even when an earlier one failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import time
import traceback
from typing import Any, Callable

RESULTS: dict[str, Any] = {}


def step(name: str, fn: Callable[[], Any]) -> None:
    """Run one check; record its value or its error (last lines of the traceback)."""
    start = time.perf_counter()
    try:
        value = fn()
        RESULTS[name] = {"ok": True, "value": value, "s": round(time.perf_counter() - start, 2)}
    except BaseException as err:  # noqa: BLE001 - a probe reports every failure, SystemExit from a child too
        tail = traceback.format_exc().strip().splitlines()[-6:]
        RESULTS[name] = {"ok": False, "error": f"{type(err).__name__}: {err}", "trace": tail}
    res = RESULTS[name]
    print(f"[{'ok' if res['ok'] else 'FAIL'}] {name}: {res.get('value', res.get('error'))}", flush=True)


def versions() -> dict[str, str]:
    out = {}
    for mod in ("torch", "transformers", "tokenizers", "sglang", "flashinfer", "tvm_ffi", "xgrammar", "torchvision"):
        m = importlib.import_module(mod)
        out[mod] = f"{getattr(m, '__version__', '?')} ({os.path.dirname(m.__file__)})"
    return out


def hopper_ops() -> str:
    import sgl_kernel
    import torch

    return f"{sgl_kernel.common_ops.__file__} on {torch.cuda.get_device_name()} sm{torch.cuda.get_device_capability()}"


def memory_saver() -> str:
    import torch
    from torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="probe"):
        x = torch.ones(2**28, device="cuda", dtype=torch.uint8)  # 256 MiB
    free0 = torch.cuda.mem_get_info()[0]
    torch_memory_saver.pause("probe")
    freed = torch.cuda.mem_get_info()[0] - free0
    torch_memory_saver.resume("probe")
    x.fill_(3)
    return f"pause freed {freed / 2**20:.0f} MiB; tensor usable after resume: {int(x[0]) == 3}"


def engine_modules() -> str:
    for mod in ("sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler", "sglang.srt.models.qwen2",
                "sglang.srt.layers.attention.triton_backend", "sglang.srt.model_executor.model_runner"):
        importlib.import_module(mod)
    return "imported"


def compiler() -> dict[str, Any]:
    home = os.environ.get("CUDA_HOME")
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    return {"CUDA_HOME": home, "nvcc": nvcc if nvcc and os.path.exists(nvcc) else None,
            "ninja": shutil.which("ninja"), "g++": shutil.which("g++") or shutil.which("c++")}


def jit_kernel() -> str:
    import torch
    from sglang.jit_kernel.activation import silu_and_mul

    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(64, 128, device="cuda", dtype=torch.bfloat16)
    silu_and_mul(x, out)
    ref = torch.nn.functional.silu(x[:, :128].float()) * x[:, 128:].float()
    return f"max |jit - torch| = {(out.float() - ref).abs().max().item():.4f}"


def engine(model_dir: str) -> dict[str, Any]:
    import sglang

    from rlpost.rollout.sglang_args import fa3_installed

    eng = sglang.Engine(model_path=model_dir, dtype="bfloat16", mem_fraction_static=0.3, skip_tokenizer_init=True,
                        attention_backend="fa3" if fa3_installed() else "triton", sampling_backend="pytorch",
                        enable_memory_saver=True, log_level="error")
    params = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}
    first = eng.generate(input_ids=[[11, 12, 13, 14]] * 4, sampling_params=params, return_logprob=True)
    eng.release_memory_occupation()
    eng.resume_memory_occupation()
    again = eng.generate(input_ids=[[11, 12, 13, 14]] * 4, sampling_params=params)
    eng.shutdown()
    return {"tokens": first[0]["output_ids"], "same_after_release_resume":
            [o["output_ids"] for o in first] == [o["output_ids"] for o in again],
            "logprob_entry": str(first[0]["meta_info"]["output_token_logprobs"][0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default=None, metavar="MODEL_DIR", help="also start a bare sglang.Engine on it")
    args = ap.parse_args()
    for name, fn in (("versions", versions), ("hopper_ops", hopper_ops), ("memory_saver", memory_saver),
                     ("engine_modules", engine_modules), ("compiler", compiler), ("jit_kernel", jit_kernel)):
        step(name, fn)
    if args.engine:
        step("engine", lambda: engine(args.engine))
    print(json.dumps(RESULTS, indent=1, default=str))


if __name__ == "__main__":
    main()
