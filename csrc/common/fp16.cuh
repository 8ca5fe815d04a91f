// fp16 pair arithmetic and conversions shared by the GEMM, attention and Gated-DeltaNet kernels. PTX rather than
// cuda_fp16.h intrinsics so that these headers compile alone under NVRTC (tools/sm70_check.py) with no CUDA headers;
// a fp16 pair travels as the uint32_t the MMA fragments hold.
#pragma once

#include "common/int_types.cuh"

namespace volta_fp4 {

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t out;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}
__device__ __forceinline__ uint32_t broadcast_low(uint32_t pair) { return __byte_perm(pair, 0, 0x1010); }
__device__ __forceinline__ uint32_t broadcast_high(uint32_t pair) { return __byte_perm(pair, 0, 0x3232); }
__device__ __forceinline__ float2 half2_to_float2(uint32_t pair) {
  float2 out;
  asm("{.reg .f16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;}"
      : "=f"(out.x), "=f"(out.y) : "r"(pair));
  return out;
}
__device__ __forceinline__ uint32_t float2_to_half2_rn(float lo_value, float hi_value) {
  uint32_t out;
  asm("{.reg .f16 lo, hi;\n cvt.rn.f16.f32 lo, %1;\n cvt.rn.f16.f32 hi, %2;\n mov.b32 %0, {lo, hi};}"
      : "=r"(out) : "f"(lo_value), "f"(hi_value));
  return out;
}

}  // namespace volta_fp4
