"""vLLM on CUDA per architecture family, bf16: the engine starts from dummy weights, rlpost's in-place sync
(`checkpoint_names`: fused experts per expert, tied copies dropped) brings the trainer's weights in, and the
engine's greedy tokens agree with the HF model's (>= 90 % of tokens: bf16 kernels round differently, so a near
tie may go the other way) with a small probability drift. Also runs as a script, one line per family."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("rollout", ".")]  # the CPU test, _compose
from test_vllm_families import ENGINE_FAMILIES, sync_and_generate  # noqa: E402

FAMILIES = sorted(ENGINE_FAMILIES + ["qwen2"])


def check(name: str, folder: Path) -> str:
    # sharper than on CPU: bf16 kernels round differently, and a flat random model's greedy ties would differ
    result = sync_and_generate(name, folder, "cuda", "bfloat16", sharpen=2.0)
    if isinstance(result, str):
        return f"{name}: refused at start-up: {result}"
    got, want, drift = result
    agree = float((got == want).float().mean())
    line = (f"{name}: greedy agreement {agree:.3f}, prob drift mean {drift['training/rollout_probs_diff_mean']:.4f} "
            f"max {drift['training/rollout_probs_diff_max']:.4f}")
    assert agree >= 0.9 and drift["training/rollout_probs_diff_mean"] < 0.02, line
    return line


def _in_own_process(name: str) -> tuple[int, str]:
    """`check(name)` in a fresh interpreter: vLLM's GPU allocator serves one engine per process."""
    import subprocess
    import tempfile

    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from test_vllm_families_gpu import "
            f"check; from pathlib import Path; print(check({name!r}, Path({tempfile.mkdtemp()!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(f"{name}: ")]
    if lines:
        return proc.returncode, lines[-1]
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "assert" in line]
    return proc.returncode, f"{name}: FAILED {errors[-1] if errors else proc.stderr.strip()[-300:]}"


@pytest.mark.parametrize("name", FAMILIES)
def test_sync_then_greedy_agrees_with_hf_on_cuda(name):
    status, line = _in_own_process(name)
    print(line)
    assert status == 0, line


if __name__ == "__main__":
    failed = 0
    for family in FAMILIES:
        status, line = _in_own_process(family)
        failed += status != 0
        print(line, flush=True)
    sys.exit(1 if failed else 0)
