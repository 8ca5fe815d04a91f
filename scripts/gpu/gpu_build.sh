# Sourced by the run_*_gpu.sh scripts: $OUT, PYTHONPATH, and the extension users install — the extension and kernel
# image of the wheel made here by `bash tools/build_wheel.sh` (carry ["dist", …]), put in place in the checkout. The
# GPU machine needs no compiler: the driver JIT-compiles the wheel's compute_80 PTX for its GPU on first use.
OUT=${OUT:-/tmp/vvf4-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
wheel=$(ls dist/vllm_volta_fp4-*-abi3-*.whl 2> /dev/null | head -1)
[[ -n "$wheel" ]] || { echo "no dist/*abi3*.whl: run bash tools/build_wheel.sh here and carry dist"; exit 1; }
# use_wheel_package WHEEL DIR: that wheel's package in the checkout's place (unpacked in DIR): its extension and
# kernel image, and its Python files, whose calls match its ops' schemas (a baseline wheel's ops may take other
# arguments than the checkout's).
use_wheel_package() {
  rm -rf vllm_volta_fp4/_C*.so vllm_volta_fp4/kernels "$2" && python3 -m zipfile -e "$1" "$2" &&
    cp -r "$2/vllm_volta_fp4/." vllm_volta_fp4/
}
use_wheel_package "$wheel" /tmp/wheel-unpacked || exit 1
echo "build: the extension of $(basename "$wheel"): $(python3 -c 'import torch, vllm_volta_fp4._C as c; print(c.kernel_origin(0))')"
