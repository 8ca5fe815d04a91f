// What the driver-API host code (csrc/driver/*_driver.cpp) shares: torch through its stable C++ ABI (ATen ops by
// name through the dispatcher, the current CUDA stream), error-message formatting, and the kernels of the image
// loaded once per device.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "driver/cuda_driver.h"

namespace volta_fp4::driver::stable_torch {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;
using Sizes = std::vector<int64_t>;

// An ATen op by name through the dispatcher; every schema argument is passed (defaults too), the first result
// returned.
template <class... Args>
Tensor aten(const char* op, const char* overload, const Args&... args) {
  std::array<StableIValue, sizeof...(Args)> stack{torch::stable::detail::from(args)...};
  STD_TORCH_CHECK(torch_call_dispatcher(op, overload, stack.data(), TORCH_ABI_VERSION) == AOTI_TORCH_SUCCESS,
                  "the dispatcher call ", op, ".", overload, " failed");
  return torch::stable::detail::to<Tensor>(stack[0]);
}

inline Tensor reshaped(const Tensor& t, const Sizes& sizes) { return torch::stable::reshape(t, sizes); }
inline Tensor permute(const Tensor& t, const Sizes& dims) { return aten("aten::permute", "", t, dims); }
inline Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1) {
  return aten("aten::slice", "Tensor", t, dim, std::optional<int64_t>(start), std::optional<int64_t>(end), step);
}
inline Tensor expand(const Tensor& t, const Sizes& sizes) { return aten("aten::expand", "", t, sizes, false); }
// Element-wise ops with a scalar take it as a 0-dim tensor on the same device (no Scalar through the ABI).
inline Tensor scalar_like(const Tensor& t, double value, ScalarType dtype) {
  return torch::stable::full({}, value, dtype, std::nullopt, t.device());
}
inline Tensor binary(const char* op, const Tensor& a, const Tensor& b) { return aten(op, "Tensor", a, b); }
inline Tensor binary(const char* op, const Tensor& a, int64_t b) { return binary(op, a, scalar_like(a, double(b), a.scalar_type())); }
inline Tensor padded(const Tensor& t, const Sizes& amounts) { return torch::stable::pad(t, amounts); }

inline std::string str(int64_t v) { return std::to_string(v); }
inline std::string shape(const Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + str(t.size(d));
  return out + "]";
}

inline void* current_stream(int32_t device) {
  // In libtorch_cuda (absent from CPU builds of torch, so looked up at run time).
  using Getter = AOTITorchError (*)(int32_t, void**);
  static const Getter getter = [] {
    void* symbol = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    if (!symbol) {
      if (void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD)) symbol = dlsym(lib, "aoti_torch_get_current_cuda_stream");
    }
    return reinterpret_cast<Getter>(symbol);
  }();
  STD_TORCH_CHECK(getter, "this torch has no CUDA (aoti_torch_get_current_cuda_stream not found)");
  void* stream = nullptr;
  STD_TORCH_CHECK(getter(device, &stream) == AOTI_TORCH_SUCCESS, "cannot get the current CUDA stream");
  return stream;
}

// A kernel of the image on a device, with its resident blocks per SM (looked up once per device and kernel).
struct LoadedKernel {
  driver::Kernel kernel;
  int blocks_per_sm;
};
inline const LoadedKernel& loaded_kernel(int device, const std::string& name, int threads, int dynamic_smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, LoadedKernel> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, name);
  auto found = cache.find(key);
  if (found == cache.end()) {
    driver::Kernel kernel(device, name);
    if (dynamic_smem) kernel.allow_dynamic_smem(dynamic_smem);
    const int blocks = std::max(kernel.max_blocks_per_sm(threads, dynamic_smem), 1);
    found = cache.emplace(key, LoadedKernel{kernel, blocks}).first;
  }
  return found->second;
}

// mma: 0 = by compute capability (7.x → Volta m8n8k4, ≥ 8.0 → SM80 m16n8k16), 70 or 80 forces one.
inline bool use_sm70_atom(int64_t mma, int device) {
  if (mma == 70) return true;
  const int major = driver::compute_capability_major(device);
  if (mma == 80) {
    STD_TORCH_CHECK(major >= 8, "the SM80 MMA atom (m16n8k16) needs compute capability >= 8.0");
    return false;
  }
  STD_TORCH_CHECK(mma == 0, "mma must be 0 (by compute capability), 70 or 80, got ", str(mma));
  return major < 8;
}

}  // namespace volta_fp4::driver::stable_torch
