# Sourced by the run_*_gpu.sh scripts: $OUT, PYTHONPATH, and the extension built in place for the GPU at hand
# (EXTENSION=wheel: the carried wheel's instead, see below).
# A fresh machine has no build: each build is also left in $OUT as extension-KEY.tgz (KEY: a digest of setup.py,
# csrc/ and the GPU architecture). Copied to .prebuilt/ here and carried (carry [".prebuilt", …]), a later call on
# the same sources unpacks it instead of compiling again.
OUT=${OUT:-/tmp/vvf4-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
ARCH=$(python3 -c "import torch; c=torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
build_key=$( (find csrc -type f | LC_ALL=C sort | xargs cat; cat setup.py; echo "$ARCH") | sha256sum | cut -c1-16)
build_start=$(date +%s)
if [[ "${EXTENSION:-nvcc}" == wheel ]]; then
  # The compiler-free build users install: the extension and kernel image of a wheel made here by
  # tools/build_wheel.sh (carry ["dist"]), put in place of the nvcc build.
  wheel=$(ls dist/vllm_volta_fp4-*-abi3-*.whl 2> /dev/null | head -1)
  [[ -n "$wheel" ]] || { echo "EXTENSION=wheel: no dist/*abi3*.whl (bash tools/build_wheel.sh here, carry dist)"; exit 1; }
  rm -rf vllm_volta_fp4/_C*.so vllm_volta_fp4/kernels /tmp/wheel-unpacked
  python3 -m zipfile -e "$wheel" /tmp/wheel-unpacked && cp /tmp/wheel-unpacked/vllm_volta_fp4/_C.abi3.so vllm_volta_fp4/ &&
    cp -r /tmp/wheel-unpacked/vllm_volta_fp4/kernels vllm_volta_fp4/ || exit 1
  build_key=wheel
  echo "build: the extension of $(basename "$wheel"): $(python3 -c 'import torch, vllm_volta_fp4._C as c; print(c.kernel_origin(0))')"
elif [[ "$(cat build/extension-key 2> /dev/null)" == "$build_key" ]] && ls vllm_volta_fp4/_C*.so > /dev/null 2>&1; then
  echo "build: the extension for $build_key is in place"  # a warm machine, or a script beside this one
elif [[ -f .prebuilt/extension-$build_key.tgz ]]; then
  tar xzf ".prebuilt/extension-$build_key.tgz" || exit 1
  echo "build: unpacked the carried extension-$build_key.tgz"
else
  TORCH_CUDA_ARCH_LIST=$ARCH VLLM_VOLTA_FP4_BUILD_EXT=1 MAX_JOBS=16 python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 \
    || { grep -E "error" "$OUT/build.log" | head -40; exit 1; }
  echo "build: $(( $(date +%s) - build_start )) s"
  tar czf "$OUT/extension-$build_key.tgz" vllm_volta_fp4/_C*.so
fi
mkdir -p build && echo "$build_key" > build/extension-key
