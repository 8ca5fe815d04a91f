# Sourced by the run_*_gpu.sh scripts: installs the carried .gpu-kit (vLLM's pure-Python part, the wheels the GPU
# machine lacks, stubs for vLLM's compiled modules) into $SITE. Make the kit here first:
#   bash benchmarks/make_gpu_kit.sh      (then carry [".gpu-kit"] in the device call)
SITE=${SITE:-/tmp/site}
rm -rf "$SITE" && mkdir -p "$SITE"
{ python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpu-kit/wheels/*.whl &&
  tar xzf .gpu-kit/vllm-py.tgz -C "$SITE" && python3 .gpu-kit/patch_vllm.py "$SITE"; } > "$OUT/kit-install.log" 2>&1 \
  || { tail -20 "$OUT/kit-install.log"; exit 1; }
