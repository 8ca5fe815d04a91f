#!/usr/bin/env bash
# Here (CPU machine): builds .gpu-kit, what the GPU machine lacks to run a real vLLM with this plugin — vLLM's
# pure-Python part and the wheels it imports (the shared gpu-vllm-kit), plus compressed-tensors and loguru, which
# vLLM imports as soon as a model is quantized, and what `vllm serve` imports. Usage: bash scripts/gpu/make_gpu_kit.sh [VLLM_VERSION] (default 0.20.2)
# Writes .gpu-kit-VLLM_VERSION (one per version, ~5 MB each) and puts its wheels into .gpu-kit-wheels/, the pool the
# kits share (most wheels are the same for both versions): a device call carries both kits and the pool (~40 MB)
# within its 64 MiB. Each kit lists its wheels in wheels.txt.
set -euo pipefail
version=${1:-0.20.2}
kit=.gpu-kit-$version
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
VLLM_VERSION=$version PYTHON=$PYTHON bash ../shared/tools/gpu-vllm-kit/make_kit.sh "$kit"
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$tmp" "vllm==$version" 2> >(grep -v "^WARNING: Location" >&2)
pin=$(unzip -p "$tmp"/vllm-*.whl "vllm-$version.dist-info/METADATA" | sed -n 's/^Requires-Dist: compressed-tensors *==\([0-9.]*\).*/\1/p')
rm -rf "$tmp"
# `vllm serve` (README's line) imports more than the engine: the HTTP server and what its request models use (the
# modules vllm.entrypoints, tool_parsers and reasoning import that the GPU machine lacks, found with those absent here).
serve=(uvicorn watchfiles model-hosting-container-standards jmespath more-itertools mistral_common ijson
       prometheus-fastapi-instrumentator setproctitle jsonschema jsonschema-specifications referencing rpds-py
       pydantic-extra-types pycountry)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$kit/wheels" \
  "compressed-tensors==$pin" loguru==0.7.3 "${serve[@]}" 2> >(grep -v "^WARNING: Location" >&2)
mkdir -p .gpu-kit-wheels
(cd "$kit/wheels" && ls ./*.whl | sed 's|^\./||') > "$kit/wheels.txt"
mv -n "$kit"/wheels/*.whl .gpu-kit-wheels/ && rm -rf "$kit/wheels"  # a name already pooled is the same file
du -sh "$kit" .gpu-kit-wheels
