// The CUDA driver API as the wheel's extension uses it: libcuda opened with dlopen at first use (so the extension
// builds without CUDA headers and imports on a machine without a GPU or driver), the kernel image shipped beside
// the extension (sm_70 machine code; PTX that the driver JIT-compiles for newer GPUs) loaded once per device, and
// launches on a given stream. Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace volta_fp4::driver {

using Stream = void*;  // a cudaStream_t / CUstream

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// One kernel of the image on one device, by its NVRTC name expression (weight_gemm_plan.h's names).
class Kernel {
 public:
  Kernel(int device, const std::string& name);
  // Raises the kernel's dynamic shared memory limit and prefers shared memory over L1 (once per kernel).
  void allow_dynamic_smem(int bytes) const;
  int max_blocks_per_sm(int threads, int dynamic_smem) const;
  // args: one pointer per kernel parameter, as cuLaunchKernel takes them.
  void launch(Dim3 grid, unsigned threads, unsigned dynamic_smem, Stream stream, void** args) const;

 private:
  void* function_;  // CUfunction
};

int multiprocessor_count(int device);
int shared_memory_per_multiprocessor(int device);  // bytes
int reserved_shared_memory_per_block(int device);  // bytes the system keeps per resident block
int compute_capability_major(int device);

// Where this device's kernels come from: "sm_70 machine code (shipped)", "PTX compute_80 (JIT for sm_90)", or
// why none can be loaded. Loads the image when it can; never raises.
std::string kernel_origin(int device);

}  // namespace volta_fp4::driver
