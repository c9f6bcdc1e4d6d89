"""Build the offline install bundle for a GPU host that has torch but no vLLM, Ray or Hydra.

Run on a machine with package-registry access (any OS/Python with pip):

    python scripts/gpu_bundle.py --out carry/gpu_bundle
    python scripts/gpu_bundle.py --sglang          # the SGLang bundle, carry/gpu_bundle_sglang

It downloads (``pip download --no-deps``, cp312, manylinux x86_64) exactly the packages in ``HOST_LACKS`` plus
a wheel of rlpost itself, drops the files a dense model on Hopper never loads (``STRIP``), re-zips every wheel
uncompressed (so that xz sees the raw bytes and compresses them well), packs them into one ``tar.xz`` and
splits it into numbered parts ``gpu_bundle.tar.xz.00``, ``.01``, ... of at most ``--part-mib`` MiB each, with
a ``SHA256SUMS`` file. ``scripts/gpu_install.sh`` reassembles and installs them on the host (docs/gpu.md).

``--cuda-toolchain`` builds a third (``CUDA_TOOLCHAIN``, parts ``gpu_bundle_cuda.tar.xz.NN``): the CUDA 13.0
compiler SGLang's run-time kernels need, installed into a folder kept off ``PYTHONPATH``.

``--sglang`` builds the second bundle instead (``SGLANG_LACKS`` / ``SGLANG_STRIP``, parts
``gpu_bundle_sglang.tar.xz.NN``): installed into its own folder and put on ``PYTHONPATH`` in front of the first
bundle's, it adds SGLang and the pins where SGLang differs from vLLM; rlpost's wheel comes with the first bundle.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

# What a host with Python 3.12 + torch 2.11.0+cu130 + transformers lacks to run rlpost with vLLM 0.24.0
# (FLASH_ATTN backend, dense Qwen2), Ray and Hydra. Verified on an H200 (shared/gpu-host-packages.txt);
# everything else vLLM declares (torch, numpy, transformers, triton, ...) is already on that host.
HOST_LACKS = """
accelerate==1.15.0 annotated_types==0.8.0 anthropic==2.14.0 antlr4_python3_runtime==4.9.3 apache_tvm_ffi==0.1.9
astor==0.8.1
blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 cffi==2.1.1 codetiming==1.4.0 compressed_tensors==0.17.0
cryptography==50.0.2 depyf==0.20.0 dill==0.4.1 diskcache==5.6.3 dnspython==2.9.2 docstring_parser==0.18.0
email_validator==2.4.0 fastapi==0.136.3 flashinfer_python==0.6.12 googleapis_common_protos==1.76.0
httpcore2==2.16.2 httptools==0.9.0 httpx2==2.16.2 hydra_core==1.3.8 ijson==3.6.0 interegular==0.3.3
jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0 jsonschema_specifications==2025.9.1 lark==1.2.2
llguidance==1.7.6 lm_format_enforcer==0.11.3 loguru==0.7.3 mcp==2.3.0 mcp_types==2.3.0 mistral_common==1.13.1
model_hosting_container_standards==0.1.16 msgspec==0.22.0 nvidia_ml_py==13.615.71 omegaconf==2.3.1
openai==3.57.0 openai_harmony==0.0.8 opentelemetry_api==1.45.2 opentelemetry_exporter_http_transport==0.66b2
opentelemetry_exporter_otlp==1.45.2 opentelemetry_exporter_otlp_common==0.66b2
opentelemetry_exporter_otlp_proto_common==1.45.2 opentelemetry_exporter_otlp_proto_grpc==1.45.2
opentelemetry_exporter_otlp_proto_http==1.45.2 opentelemetry_proto==1.45.2 opentelemetry_sdk==1.45.2
opentelemetry_semantic_conventions==0.66b2 opentelemetry_semantic_conventions_ai==0.5.1 outlines_core==0.2.14
partial_json_parser==0.2.1.1.post7 prometheus_fastapi_instrumentator==8.1.0 pybase64==1.5.1
peft==0.21.2 pycountry==26.2.16 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5 pydantic_extra_types==2.11.1
pydantic_settings==2.16.3 pyjwt==2.15.1 python_dotenv==1.2.4 python_json_logger==4.2.0
python_multipart==0.0.34 pyvers==0.2.3 pyzmq==27.3.0 ray==2.60.0 referencing==0.37.0 rpds_py==2026.9.1
setproctitle==1.3.8 sniffio==1.3.1 sse_starlette==3.7.0 starlette==1.10.0 supervisor==4.3.0
tensordict==0.15.3 truststore==0.10.5 typing_inspection==0.4.5 uvicorn==0.54.0 vllm==0.24.0
watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.3
""".split()

# Files no bf16 model on Hopper loads: vLLM's FA2 build (FA3 serves sm_90), the vllm-rs server binary, deep_gemm
# builds for other Pythons, Ray's Java jars and xgrammar's static library. vLLM's MoE kernels (`_moe_C`) stay:
# the MoE families (Qwen3-MoE, DeepSeek-V3, GLM-4.5, gpt-oss) route their experts through them.
STRIP = [
    r"^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$",
    r"^vllm/vllm-rs$",
    r"^vllm/third_party/deep_gemm/_C\.cpython-3(?!12)\d+-.*\.so$",
    r"^ray/jars/",
    r"^xgrammar/.*\.a$",
]

# What the SGLang bundle adds on top of the vLLM one to run sglang 0.5.16's offline Engine (dense Qwen2, triton
# attention, PyTorch sampler, memory saver) on that host. Pins differing from the vLLM bundle's are SGLang's own:
# transformers 5.12.1 (the host's 5.17 already registers `qwen3_asr`, which sglang registers again at import),
# with the tokenizers it accepts; apache_tvm_ffi, openai and xgrammar as sglang pins them. torchvision 0.26.0
# (the cu130 build for torch 2.11) because `sglang.srt.utils.common` imports `torchvision.io` at import time;
# IPython (with traitlets, pygments) because `sglang.utils` imports `IPython.display`.
SGLANG_LACKS = """
sglang==0.5.16 sglang_kernel==0.4.5 flashinfer_python==0.6.14 apache_tvm_ffi==0.1.11 torch_memory_saver==0.0.10
transformers==5.12.1 tokenizers==0.22.2 openai==2.6.1 distro==1.9.0 xgrammar==0.2.1 torchvision==0.26.0
orjson==3.13.0 uvloop==0.23.0 gguf==0.19.0 ipython==9.18.1 traitlets==5.16.1 pygments==2.21.0
""".split()

# Files SGLang never loads for a dense bf16 model on Hopper with the triton attention backend: the FA3 library
# (`flash_ops`, 1 GiB, loaded only by attention_backend=fa3), the sm_100 (Blackwell) op library, the InfLLM-V2
# and FlashMLA libraries (sparse / MLA attention), the memory saver's CUDA 12 builds, xgrammar's static library.
SGLANG_STRIP = [
    r"^sgl_kernel/flash_ops\.abi3\.so$",
    r"^sgl_kernel/sm100/",
    r"^sgl_kernel/infllm_ops\.",
    r"^sgl_kernel/flashmla_ops\.",
    r"^torch_memory_saver_hook_mode_(preload|torch)(_cu12)?\.abi3\.so$",
    r"^xgrammar/.*\.a$",
]

# A CUDA 13.0 compiler for the kernels SGLang compiles at run time (`sglang.jit_kernel`: rotary embedding,
# SiLU-and-mul, the KV-cache store, position clamping; through tvm_ffi, nvcc and ninja) on a host without a CUDA
# toolkit. Installed into a folder of its own, kept OFF PYTHONPATH (its `nvidia/cu13` would shadow the host's
# CUDA wheels); `gpu_install.sh` adds the `lib64` and `libcudart.so` links nvcc's link step looks for, and
# prints CUDA_HOME / PATH. Needs the host's C++ compiler (g++).
CUDA_TOOLCHAIN = """
nvidia_cuda_nvcc==13.0.88 nvidia_cuda_crt==13.0.88 nvidia_nvvm==13.0.88 nvidia_cuda_cccl==13.0.85
nvidia_cuda_runtime==13.0.96 ninja==1.13.2
""".split()

# Pins published only as source distributions (pure python): built into wheels locally.
SDIST_ONLY = {"antlr4_python3_runtime"}

PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]


def download(specs: list[str], dest: Path) -> None:
    """Download each wheel for cp312 / manylinux x86_64 without dependencies into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd += ["--platform", "any"]
    binary = [s for s in specs if s.split("==")[0] not in SDIST_ONLY]
    subprocess.run(cmd + binary, check=True)
    # These pins ship only as an sdist: build them into pure-python wheels here.
    sdist = [s for s in specs if s.split("==")[0] in SDIST_ONLY]
    if sdist:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dest), *sdist], check=True)


def build_rlpost_wheel(repo: Path, dest: Path) -> None:
    """Build rlpost's own (pure-python) wheel into ``dest``."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest),
                    str(repo)], check=True)


def restrip_wheel(src: Path, dest_dir: Path, patterns: list[re.Pattern]) -> tuple[int, int]:
    """Copy a wheel without the files matching ``patterns``, stored uncompressed.

    The RECORD file loses the lines of the removed files, so pip installs the result as a normal wheel.

    Returns:
        (bytes kept, bytes removed), uncompressed.
    """
    kept = removed = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest_dir / src.name, "w", zipfile.ZIP_STORED) as zout:
        dropped = {i.filename for i in zin.infolist() if any(p.search(i.filename) for p in patterns)}
        for info in zin.infolist():
            if info.filename in dropped:
                removed += info.file_size
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD") and dropped:
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines if ln.split(",", 1)[0] not in dropped).encode()
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
            kept += len(data)
    return kept, removed


def pack(stage: Path, out: Path, part_mib: int, level: int, name: str = "gpu_bundle") -> list[Path]:
    """tar + xz the folder ``stage`` into ``name.tar.xz`` and split the stream into parts of at most ``part_mib``
    MiB (``name.tar.xz.00``, ...)."""
    archive = out / f"{name}.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(stage, arcname="wheels")
    subprocess.run(["xz", "-f", f"-{level}", "-T0", str(archive)], check=True)
    xz_path = archive.with_suffix(".tar.xz")
    parts, size = [], part_mib * 2**20
    with open(xz_path, "rb") as f:
        while chunk := f.read(size):
            part = out / f"{xz_path.name}.{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    xz_path.unlink()
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in parts]
    (out / "SHA256SUMS").write_text("".join(sums))
    return parts


def main() -> None:
    """Download, strip, pack, split; print the parts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang", action="store_true", help="build the SGLang bundle (SGLANG_LACKS) instead")
    ap.add_argument("--cuda-toolchain", action="store_true", help="build the CUDA compiler bundle (CUDA_TOOLCHAIN)")
    ap.add_argument("--out", type=Path, default=None, help="default carry/<bundle name>")
    ap.add_argument("--part-mib", type=int, default=55)
    ap.add_argument("--xz-level", type=int, default=9)
    ap.add_argument("--no-rlpost", action="store_true", help="leave rlpost's own wheel out")
    ap.add_argument("--cache", type=Path, default=None, help="reuse downloaded wheels from this folder")
    args = ap.parse_args()
    name, lacks, strip = "gpu_bundle", HOST_LACKS, STRIP
    if args.sglang:
        name, lacks, strip = "gpu_bundle_sglang", SGLANG_LACKS, SGLANG_STRIP
    elif args.cuda_toolchain:
        name, lacks, strip = "gpu_bundle_cuda", CUDA_TOOLCHAIN, []
    out = args.out or Path("carry") / name
    repo = Path(__file__).resolve().parents[1]
    raw = args.cache or out / "raw"
    stage = out / "wheels"
    for d in (raw, stage):
        d.mkdir(parents=True, exist_ok=True)
    download(lacks, raw)
    if name == "gpu_bundle" and not args.no_rlpost:
        build_rlpost_wheel(repo, raw)
    patterns = [re.compile(p) for p in strip]
    total_kept = total_removed = 0
    for whl in sorted(raw.glob("*.whl")):
        kept, removed = restrip_wheel(whl, stage, patterns)
        total_kept, total_removed = total_kept + kept, total_removed + removed
    print(f"wheels: {len(list(stage.glob('*.whl')))}, kept {total_kept / 2**20:.0f} MiB, "
          f"stripped {total_removed / 2**20:.0f} MiB")
    for old in out.glob(f"{name}.tar.xz.*"):
        old.unlink()
    parts = pack(stage, out, args.part_mib, args.xz_level, name)
    shutil.rmtree(stage)
    for p in parts:
        print(f"{p}  {p.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
