// Host-side pieces every op family's bindings share: which MMA atom a launch uses, the opt-in to more than 48 KB of
// dynamic shared memory, and integers in error messages. Host code only (torch headers); the kernels' .cuh files
// stay free of it so that NVRTC compiles them alone.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <cstdint>
#include <string>

namespace volta_fp4 {

// Integers in error messages go through std::to_string, never an ostream: an extension built with a newer host
// compiler than the libstdc++ it runs with (the GPU machine's /opt/gcc) crashed in ostream << int64_t.
inline std::string str(int64_t v) { return std::to_string(v); }
inline std::string str(at::IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

// mma: 0 = by compute capability (7.x → Volta m8n8k4, ≥ 8.0 → SM80 m16n8k16), 70 or 80 forces one. The Volta
// atom runs everywhere (Hopper executes m8n8k4 in a compatibility mode); the SM80 atom needs ≥ 8.0.
inline bool use_sm70_atom(int64_t mma, const at::Device& device) {
  const int major = at::cuda::getDeviceProperties(device.index())->major;
  TORCH_CHECK(mma == 0 || mma == 70 || mma == 80, "mma must be 0 (by compute capability), 70 or 80, got ", str(mma));
  TORCH_CHECK(mma != 80 || major >= 8, "the SM80 MMA atom (m16n8k16) needs compute capability >= 8.0");
  return mma == 70 || (mma == 0 && major < 8);
}

// Kernels above 48 KB of dynamic shared memory must opt in once per instantiation (callers keep a static flag).
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, int bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace volta_fp4
