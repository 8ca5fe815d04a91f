// VOLTA_FP4_HOST_DEVICE: a function of a torch- and CUDA-free header that nvcc and NVRTC compile for the GPU too,
// and a plain C++ compiler (the driver-API host code in csrc/driver/) for the host only.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define VOLTA_FP4_HOST_DEVICE __host__ __device__
#else
#define VOLTA_FP4_HOST_DEVICE
#endif
