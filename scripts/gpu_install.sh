#!/usr/bin/env bash
# Reassemble the offline bundle made by scripts/gpu_bundle.py and install it into a folder (no network).
#
#   bash scripts/gpu_install.sh PARTS_DIR [TARGET_DIR]     # TARGET_DIR defaults to /tmp/rlpost_site
#
# PARTS_DIR holds the parts of ONE bundle (gpu_bundle.tar.xz.00, .01, ..., gpu_bundle_sglang.tar.xz.NN or
# gpu_bundle_cuda.tar.xz.NN) and SHA256SUMS. The SGLang bundle goes into its own TARGET_DIR, put on PYTHONPATH in
# front of the first one's; the CUDA compiler bundle into another, off PYTHONPATH (CUDA_HOME / PATH instead). The wheels go in with
# `pip install --no-index --no-deps --target`, so the host's own torch / transformers stay untouched.
# The last line printed is the `export PYTHONPATH=...` line to run (see docs/gpu.md).
set -euo pipefail

parts_dir=${1:?usage: gpu_install.sh PARTS_DIR [TARGET_DIR]}
target=${2:-/tmp/rlpost_site}
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/rlpost_bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT

cd "$parts_dir"
if [[ -f SHA256SUMS ]]; then
    sha256sum --quiet -c SHA256SUMS
fi
shopt -s nullglob
parts=(gpu_bundle*.tar.xz.[0-9][0-9])
(( ${#parts[@]} > 0 )) || { echo "no gpu_bundle*.tar.xz.NN parts in $parts_dir" >&2; exit 1; }
stems=$(printf '%s\n' "${parts[@]}" | sed 's/\.[0-9][0-9]$//' | sort -u)
[[ $(wc -l <<<"$stems") == 1 ]] || { echo "parts of several bundles in $parts_dir: $stems" >&2; exit 1; }
cat "${parts[@]}" | xz -d -T0 | tar -x -C "$work"
cd - >/dev/null

mkdir -p "$target"
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$target" "$work"/wheels/*.whl
echo "installed $(ls "$work"/wheels | wc -l) wheels into $target" >&2
cuda=$target/nvidia/cu13
if [[ ${stems} == gpu_bundle_cuda.tar.xz && -x $cuda/bin/nvcc ]]; then
    # nvcc's link step looks for lib64/ and an unversioned libcudart.so; the wheels ship lib/libcudart.so.13.
    ln -sfn lib "$cuda/lib64"
    ln -sf libcudart.so.13 "$cuda/lib/libcudart.so"
    echo "export CUDA_HOME=$cuda PATH=$target/bin:\$PATH"   # NOT on PYTHONPATH: it would shadow the host's nvidia/
else
    echo "export PYTHONPATH=$target\${PYTHONPATH:+:\$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0"
fi
