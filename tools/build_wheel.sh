#!/usr/bin/env bash
# Build the wheel users install (no CUDA compiler needed, here or there): every kernel (GEMM, attention, GDN)
# compiled by NVRTC 12.9 + ptxas 12.9 into sm_70 machine code (and compute_80 PTX for newer GPUs), host code built
# by g++ against torch 2.10's stable ABI headers. Installs what it needs into .toolchain/ (PyPI); writes dist/*.whl.
#   bash tools/build_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TOOLCHAIN=.toolchain
TORCH_FOR_HEADERS=2.10.0  # vLLM 0.19.1's pin; the oldest stable ABI the binary targets
start=$(date +%s)
if [ ! -x "$TOOLCHAIN/venv/bin/python" ]; then
  "$PYTHON" -m venv "$TOOLCHAIN/venv"
fi
"$TOOLCHAIN/venv/bin/pip" install -q -U "setuptools>=70.1" wheel build \
  nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86
if [ ! -f "$TOOLCHAIN/torch-include/torch/csrc/stable/library.h" ]; then
  "$TOOLCHAIN/venv/bin/pip" download -q --no-deps "torch==$TORCH_FOR_HEADERS" --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$TOOLCHAIN/download"
  "$TOOLCHAIN/venv/bin/python" - "$TOOLCHAIN" <<'PY'
import glob, sys, zipfile
toolchain = sys.argv[1]
wheel = glob.glob(f"{toolchain}/download/torch-*.whl")[0]
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if name.startswith("torch/include/"):
            archive.extract(name, f"{toolchain}/extract")
PY
  rm -rf "$TOOLCHAIN/torch-include" && mv "$TOOLCHAIN/extract/torch/include" "$TOOLCHAIN/torch-include"
  rm -rf "$TOOLCHAIN/extract" "$TOOLCHAIN/download"
fi
rm -rf build vllm_volta_fp4/kernels
# The toolchain venv's site-packages holds the NVRTC/ptxas wheels that tools/sm70_check.py looks for.
VLLM_VOLTA_FP4_BUILD_EXT=1 VLLM_VOLTA_FP4_TORCH_INCLUDE="$PWD/$TOOLCHAIN/torch-include" \
  "$TOOLCHAIN/venv/bin/python" -m build --wheel --no-isolation --outdir dist .
echo "build_wheel: $(ls dist/*.whl) in $(( $(date +%s) - start )) s"
