# Sourced by the run_*_gpu.sh scripts: $OUT, PYTHONPATH, and the extension built in place for the GPU at hand.
OUT=${OUT:-/tmp/vvf4-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
ARCH=$(python3 -c "import torch; c=torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
build_start=$(date +%s)
TORCH_CUDA_ARCH_LIST=$ARCH VLLM_VOLTA_FP4_BUILD_EXT=1 MAX_JOBS=16 python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 \
  || { grep -E "error" "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - build_start )) s"
