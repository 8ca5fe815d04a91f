// Division by a divisor fixed at launch (a GQA group, a cache block size) as a multiply-high, an add and a shift: an
// integer division by a runtime value is ~20 instructions on the GPU (a float reciprocal and two corrections), and
// the attention kernels divide row and key indices in their prologue, per KV tile and per output row.
// Torch- and CUDA-free: the host computes the constants, the kernels and the host tests divide with them.
#pragma once

#include "common/host_device.h"
#include "common/int_types.cuh"

namespace volta_fp4 {

// Round-up multiplier (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994): with
// l = ⌈log2 d⌉ and m = ⌊2^32 (2^l − d) / d⌋ + 1, ⌊n / d⌋ = (⌊m n / 2^32⌋ + n) >> l for every 0 ≤ n < 2^32; the sum is
// formed in 32 bits, so numerators stay below 2^31 (row, key and token indices do).
struct FastDivisor {
  uint32_t divisor;
  uint32_t multiplier;
  uint32_t shift;
};

VOLTA_FP4_HOST_DEVICE inline FastDivisor make_fast_divisor(uint32_t divisor) {  // divisor ≥ 1; the host makes them
  uint32_t shift = 0;
  while ((uint64_t(1) << shift) < divisor) ++shift;
  const uint64_t multiplier = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor)) / divisor + 1;
  return FastDivisor{divisor, uint32_t(multiplier), shift};
}

VOLTA_FP4_HOST_DEVICE inline int fast_quotient(const FastDivisor& d, int n) {  // ⌊n / d⌋, 0 ≤ n < 2^31
#if defined(__CUDA_ARCH__)
  const uint32_t high = __umulhi(uint32_t(n), d.multiplier);
#else
  const uint32_t high = uint32_t((uint64_t(uint32_t(n)) * d.multiplier) >> 32);
#endif
  return int((high + uint32_t(n)) >> d.shift);
}

// quotient and remainder of n / d
VOLTA_FP4_HOST_DEVICE inline int fast_divmod(const FastDivisor& d, int n, int& remainder) {
  const int quotient = fast_quotient(d, n);
  remainder = n - quotient * int(d.divisor);
  return quotient;
}

}  // namespace volta_fp4
