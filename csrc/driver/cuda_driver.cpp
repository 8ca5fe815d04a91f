#include "driver/cuda_driver.h"

#include <dlfcn.h>

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace volta_fp4::driver {
namespace {

// The few driver-API declarations used here (cuda.h's values; cuda.h itself is not needed to build).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
constexpr int kAttrMultiprocessorCount = 16;        // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrComputeCapabilityMajor = 75;     // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;     // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kAttrSharedMemoryPerSm = 81;         // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
constexpr int kAttrReservedSharedPerBlock = 111;   // CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
constexpr int kFuncMaxDynamicSharedSize = 8;        // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kFuncPreferredSharedCarveout = 9;     // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
constexpr int kCarveoutMaxShared = 100;             // CU_SHAREDMEM_CARVEOUT_MAX_SHARED

struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**);
};

template <class F>
void bind(void* lib, F& slot, const char* name) {
  slot = reinterpret_cast<F>(dlsym(lib, name));
  if (!slot) throw std::runtime_error(std::string("libcuda.so.1 has no ") + name);
}

const Api& api() {
  static const Api loaded = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error(std::string("cannot load the CUDA driver (libcuda.so.1): ") + dlerror());
    Api a{};
    bind(lib, a.cuInit, "cuInit");
    bind(lib, a.cuGetErrorString, "cuGetErrorString");
    bind(lib, a.cuDeviceGet, "cuDeviceGet");
    bind(lib, a.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    bind(lib, a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    bind(lib, a.cuCtxGetCurrent, "cuCtxGetCurrent");
    bind(lib, a.cuCtxSetCurrent, "cuCtxSetCurrent");
    bind(lib, a.cuModuleLoadData, "cuModuleLoadData");
    bind(lib, a.cuModuleGetFunction, "cuModuleGetFunction");
    bind(lib, a.cuFuncSetAttribute, "cuFuncSetAttribute");
    bind(lib, a.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    bind(lib, a.cuLaunchKernel, "cuLaunchKernel");
    return a;
  }();
  return loaded;
}

void check(CUresult status, const std::string& what) {
  if (status == 0) return;
  const char* text = nullptr;
  api().cuGetErrorString(status, &text);
  throw std::runtime_error(what + ": CUDA driver error " + std::to_string(status) + " (" + (text ? text : "?") + ")");
}

CUdevice device_handle(int device) {
  static const CUresult init = api().cuInit(0);
  check(init, "cuInit");
  CUdevice handle = 0;
  check(api().cuDeviceGet(&handle, device), "cuDeviceGet");
  return handle;
}

int attribute(int device, int which) {
  int value = 0;
  check(api().cuDeviceGetAttribute(&value, which, device_handle(device)), "cuDeviceGetAttribute");
  return value;
}

// The directory of this shared library: the kernel image lies beside it (vllm_volta_fp4/kernels/).
std::string image_dir() {
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&image_dir), &info);
  const std::string self = info.dli_fname ? info.dli_fname : "";
  return self.substr(0, self.rfind('/') + 1) + "kernels/";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("missing kernel image file " + path);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// image.names.tsv: "<name expression>\t<lowered (mangled) name>" per kernel, written by the wheel build.
const std::map<std::string, std::string>& lowered_names() {
  static const std::map<std::string, std::string> names = [] {
    std::map<std::string, std::string> table;
    std::istringstream lines(read_file(image_dir() + "image.names.tsv"));
    for (std::string line; std::getline(lines, line);) {
      const size_t tab = line.find('\t');
      if (tab != std::string::npos) table[line.substr(0, tab)] = line.substr(tab + 1);
    }
    return table;
  }();
  return names;
}

// Compute capability 7.x runs the shipped sm_70 machine code (binary compatible within a major version); newer
// GPUs JIT the compute_80 PTX (compute_80 so that the m16n8k16 atom exists; the driver caches the result).
struct Image {
  std::string file, origin;
};
Image image_for(int device) {
  const int major = attribute(device, kAttrComputeCapabilityMajor);
  const std::string sm = "sm_" + std::to_string(major) + std::to_string(attribute(device, kAttrComputeCapabilityMinor));
  if (major == 7) return {"image.sm_70.cubin", "sm_70 machine code (shipped) on " + sm};
  if (major >= 8) return {"image.compute_80.ptx", "PTX compute_80, JIT-compiled by the driver for " + sm};
  throw std::runtime_error("compute capability " + sm + " is older than Volta: no kernels for it");
}

struct DeviceModule {
  CUcontext context = nullptr;
  CUmodule module = nullptr;
};

std::mutex modules_mutex;
std::map<int, DeviceModule>& modules() {
  static std::map<int, DeviceModule> loaded;
  return loaded;
}

// The device's primary context (torch's), made current on this thread; its module loaded on first use.
const DeviceModule& module_for(int device) {
  std::lock_guard<std::mutex> lock(modules_mutex);
  DeviceModule& entry = modules()[device];
  if (!entry.context) check(api().cuDevicePrimaryCtxRetain(&entry.context, device_handle(device)), "cuDevicePrimaryCtxRetain");
  CUcontext current = nullptr;
  check(api().cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != entry.context) check(api().cuCtxSetCurrent(entry.context), "cuCtxSetCurrent");
  if (!entry.module) {
    const Image image = image_for(device);
    std::string bytes = read_file(image_dir() + image.file);
    bytes.push_back('\0');  // PTX is loaded as a NUL-terminated string
    check(api().cuModuleLoadData(&entry.module, bytes.data()), "cuModuleLoadData(" + image.file + ")");
  }
  return entry;
}

}  // namespace

Kernel::Kernel(int device, const std::string& name) : function_(nullptr) {
  const auto found = lowered_names().find(name);
  if (found == lowered_names().end()) throw std::runtime_error("kernel " + name + " is not in the kernel image");
  check(api().cuModuleGetFunction(&function_, module_for(device).module, found->second.c_str()),
        "cuModuleGetFunction(" + name + ")");
}

void Kernel::allow_dynamic_smem(int bytes) const {
  check(api().cuFuncSetAttribute(function_, kFuncMaxDynamicSharedSize, bytes), "cuFuncSetAttribute(smem)");
  check(api().cuFuncSetAttribute(function_, kFuncPreferredSharedCarveout, kCarveoutMaxShared),
        "cuFuncSetAttribute(carveout)");
}

int Kernel::max_blocks_per_sm(int threads, int dynamic_smem) const {
  int blocks = 0;
  check(api().cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function_, threads, size_t(dynamic_smem)),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

void Kernel::launch(Dim3 grid, unsigned threads, unsigned dynamic_smem, Stream stream, void** args) const {
  check(api().cuLaunchKernel(function_, grid.x, grid.y, grid.z, threads, 1, 1, dynamic_smem, stream, args, nullptr),
        "cuLaunchKernel");
}

int multiprocessor_count(int device) { return attribute(device, kAttrMultiprocessorCount); }
int shared_memory_per_multiprocessor(int device) { return attribute(device, kAttrSharedMemoryPerSm); }
int reserved_shared_memory_per_block(int device) { return attribute(device, kAttrReservedSharedPerBlock); }
int compute_capability_major(int device) { return attribute(device, kAttrComputeCapabilityMajor); }

std::string kernel_origin(int device) {
  try {
    const Image image = image_for(device);
    module_for(device);
    return image.origin;
  } catch (const std::exception& error) {
    return std::string("missing: ") + error.what();
  }
}

}  // namespace volta_fp4::driver
